"""``hermes-archive demo --peers``: three agents on a local Synapse; two meet through the third.

A throw-away Synapse starts on 127.0.0.1 (:mod:`hivemind.homeserver`), three accounts are
registered, and three HivemindProviders run, each in its own profile folder with its own
log. Carol knows Alice and Bob; Alice and Bob know no one. Carol greets both, sees from
their published profiles that they share an interest (a spark), and introduces them; Alice
writes to Bob, Bob answers. Then both peer blocks are printed as their agents would see them,
every log is verified (chain and payloads) and each agent's peer state is rebuilt from its
log and compared with the live one.

The credentials go to each provider through the environment just before it initializes
(hermes 0.19.0 has no per-profile secret scope); they are printed nowhere.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from archive_provider import DemoRefused, EventStore, archive_dir, demo_home, verify_database

from .homeserver import Homeserver
from .peers import PeersProjection
from .provider import HivemindProvider
from .settings import CREDENTIALS, save_settings

AGENTS: dict[str, dict[str, Any]] = {
    "alice": {"about": "Security researcher", "interests": ["TEE attestation", "SEV-SNP"]},
    "bob": {"about": "Frontend developer", "interests": ["attestation dashboards", "React"]},
    "carol": {"about": "Team lead who knows everyone"},
}
WAIT_S = 20.0
INTRO_CONTEXT = "Alice verifies TEE attestation reports; Bob builds attestation dashboards."
QUESTION = "Hi Bob, Carol introduced us. Which attestation fields does your dashboard show?"
ANSWER = "Hi Alice! Measurement, TCB version and report freshness. What else should it check?"


@dataclass
class PeersDemoResult:
    home: Path
    agents: dict[str, str] = field(default_factory=dict)  # name -> Matrix user id
    spark: list[str] = field(default_factory=list)  # the pair Carol's projection suggested
    introduction_room: str = ""
    exchanged: list[dict[str, str]] = field(default_factory=list)
    blocks: dict[str, str] = field(default_factory=dict)  # name -> its prefetch peer block
    verified: dict[str, dict[str, Any]] = field(default_factory=dict)
    replayed: dict[str, bool] = field(default_factory=dict)  # peer state equal after rebuild
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            len(self.exchanged) == 2
            and all(v.get("ok") for v in self.verified.values())
            and all(self.replayed.values())
            and bool(self.replayed)
        )


def _check_synapse() -> None:
    if not os.environ.get("SYNAPSE_PYTHON") and importlib.util.find_spec("synapse") is None:
        raise DemoRefused(
            "the peers demo runs a local Synapse: bash .ci/setup (the full set), or pip install "
            "'.[hivemind,test]' (or set SYNAPSE_PYTHON to a Python that has it)"
        )


@contextmanager
def _credentials(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _wait(probe: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.1)
    raise RuntimeError(f"the demo waited {WAIT_S:.0f} s for {what}")


def _call(provider: HivemindProvider, tool: str, **args: Any) -> dict[str, Any]:
    result = json.loads(provider.handle_tool_call(tool, args))
    if "error" in result:
        raise RuntimeError(f"{tool} failed: {result['error']}")
    return dict(result)


def _peers(provider: HivemindProvider) -> list[dict[str, Any]]:
    return list(_call(provider, "hivemind_list_peers")["peers"])


def run_peers_demo(home: Path, say: Callable[[str], None] = print) -> PeersDemoResult:
    """Run the scenario (narrated through ``say``) and return what happened."""
    home = home.resolve()
    _check_synapse()
    with demo_home(home, "hermes-archive demo --peers"):
        return _run(home, say)


def _run(home: Path, say: Callable[[str], None]) -> PeersDemoResult:
    result = PeersDemoResult(home)
    started = time.monotonic()
    server = Homeserver(_fresh(home / "synapse"))
    providers: dict[str, HivemindProvider] = {}
    server.start()
    try:
        say(f"Synapse on {server.base_url} (loopback only, no federation)")
        accounts = {
            name: server.register(f"hermes-of-{name}", secrets.token_urlsafe(16)) for name in AGENTS
        }
        result.agents = {name: account["user_id"] for name, account in accounts.items()}
        for name, account in accounts.items():
            profile_home = home / name
            settings: dict[str, Any] = {"poll_ms": 1000, "connect_wait_s": 10, **AGENTS[name]}
            if name == "carol":
                settings["contacts"] = [result.agents["alice"], result.agents["bob"]]
            save_settings(profile_home, settings)
            values = dict(
                zip(
                    CREDENTIALS,
                    (server.base_url, account["user_id"], account["access_token"]),
                    strict=True,
                )
            )
            with _credentials({**values, "MATRIX_DEVICE_ID": account["device_id"]}):
                provider = HivemindProvider()
                provider.initialize("demo", hermes_home=str(profile_home), platform="demo")
            providers[name] = provider
            say(f"  {name}: {account['user_id']}, profile {profile_home}")
        alice, bob, carol = providers["alice"], providers["bob"], providers["carol"]
        _scenario(result, alice, bob, carol, say)
    finally:
        for provider in providers.values():
            provider.shutdown()
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)
    for name in AGENTS:
        result.verified[name], result.replayed[name] = _audit(home / name)
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _fresh(folder: Path) -> Path:
    folder.mkdir(parents=True)
    return folder


def _scenario(
    result: PeersDemoResult,
    alice: HivemindProvider,
    bob: HivemindProvider,
    carol: HivemindProvider,
    say: Callable[[str], None],
) -> None:
    ids = result.agents
    say("Carol greets Alice and Bob (encrypted direct rooms; they publish their profiles)")
    for name in ("alice", "bob"):
        _call(
            carol,
            "hivemind_send_to_peer",
            peer_name=ids[name],
            message=f"Hello {name.title()}, Carol's agent here.",
        )
    spark = _wait(lambda: _call(carol, "hivemind_list_peers")["suggestions"], "Carol's suggestion")[
        0
    ]
    result.spark = [spark["peer_a"], spark["peer_b"]]
    say("Carol's context now suggests an introduction:\n" + _indent(carol.peer_context()))
    intro = _call(
        carol,
        "hivemind_introduce_peers",
        peer_a="hermes-of-alice",
        peer_b="hermes-of-bob",
        context=INTRO_CONTEXT,
    )
    result.introduction_room = intro["room_id"]
    say(f"Carol introduces them in {intro['room_id']}")
    _wait(
        lambda: any(p["user_id"] == ids["bob"] and p["introduced_by"] for p in _peers(alice)),
        "Alice to meet Bob",
    )
    _call(alice, "hivemind_send_to_peer", peer_name="hermes-of-bob", message=QUESTION)
    _wait(
        lambda: any(p["user_id"] == ids["alice"] and p["unread"] for p in _peers(bob)),
        "Alice's message at Bob",
    )
    for message in _call(bob, "hivemind_check_messages", peer_name="hermes-of-alice")["messages"]:
        result.exchanged.append({"from": "alice", "to": "bob", "text": message["text"]})
        say(f"  Bob reads from Alice (encrypted: {message['encrypted']}): {message['text']}")
    _call(bob, "hivemind_send_to_peer", peer_name="hermes-of-alice", message=ANSWER)
    _wait(
        lambda: any(p["user_id"] == ids["bob"] and p["unread"] for p in _peers(alice)),
        "Bob's answer at Alice",
    )
    for message in _call(alice, "hivemind_check_messages", peer_name="hermes-of-bob")["messages"]:
        result.exchanged.append({"from": "bob", "to": "alice", "text": message["text"]})
        say(f"  Alice reads from Bob (encrypted: {message['encrypted']}): {message['text']}")
    # Each side's summary of the other is derived from what it said: wait for both.
    _wait(
        lambda: (
            all(p["summary"] for p in _peers(alice) if p["user_id"] == ids["bob"])
            and all(p["summary"] for p in _peers(bob) if p["user_id"] == ids["alice"])
        ),
        "both summaries",
    )
    for name, provider in (("alice", alice), ("bob", bob)):
        result.blocks[name] = provider.peer_context()
        say(
            f"\n{name.title()}'s peer block (injected every turn):\n" + _indent(result.blocks[name])
        )


def _audit(profile_home: Path) -> tuple[dict[str, Any], bool]:
    """Verify the chain and payloads; rebuild the peer state from the log and compare."""
    store = EventStore.open(archive_dir(profile_home), projections=[PeersProjection()])
    try:
        report = verify_database(store.conn, store.key).as_dict()
        live = PeersProjection().digest(store.conn)
        with store.transaction():
            PeersProjection().drop(store.conn)
    finally:
        store.close()
    rebuilt = EventStore.open(archive_dir(profile_home), projections=[PeersProjection()])
    try:
        return report, PeersProjection().digest(rebuilt.conn) == live
    finally:
        rebuilt.close()


def _indent(text: str) -> str:
    return "    " + text.replace("\n", "\n    ")


def run_command(ctx: Any) -> int:
    """The ``demo --peers`` command: narrate, then a summary (or JSON with --json)."""
    import io

    from archive_provider import UsageError

    out = io.StringIO() if ctx.json else ctx.out  # under --json only the JSON is printed
    # nio warns about every Olm session it sets up ("Missing session for device"): expected here.
    logging.getLogger("nio").setLevel(logging.ERROR)

    def say(line: str) -> None:
        out.write(line + "\n")

    try:
        result = run_peers_demo(ctx.home, say=say)
    except DemoRefused as exc:
        raise UsageError(str(exc)) from None

    def human(_: object) -> str:
        lines = [""]
        for name, report in result.verified.items():
            state = (
                f"ok, {report['events_checked']} events"
                if report.get("ok")
                else f"FAILED at seq {report.get('first_bad_seq')}: {report.get('problem')}"
            )
            rebuilt = "identical" if result.replayed.get(name) else "DIFFERENT"
            lines.append(f"verify {name}: {state}; peer state rebuilt from the log: {rebuilt}")
        lines.append(
            f"Done in {result.seconds} s. Logs: {result.home}/<name>/archive/events.db "
            f"(hermes-archive --home {result.home}/alice log)"
        )
        return "\n".join(lines)

    data = asdict(result) | {"home": str(result.home), "ok": result.ok}
    ctx.emit(data, human)
    return 0 if result.ok else 1
