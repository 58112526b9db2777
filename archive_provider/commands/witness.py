"""witness: show the external witness, or re-anchor it after a deliberate restore.

A restore from backup looks exactly like a rollback (the archive holds fewer events than the
witness saw, or another history), so the provider refuses to append until someone says it
was deliberate: ``hermes-archive witness accept --reason "restored from backup of ..."``.
That verifies the archive, records a ``witness_accepted`` event (who, why, what the witness
said before) committed with synchronous=FULL, and only then writes the new witness.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from archive_provider.commands import CommandContext, CommandError, UsageError

if TYPE_CHECKING:
    from archive_provider.storage.witness import Witness

NAME = "witness"
HELP = (
    "show the external witness of the chain head, or accept the archive as it is now; "
    "serve a C2SP tlog-witness (serve, keygen)"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("show", "accept", "add", "remove", "serve", "keygen"),
        help="show, accept (re-anchor), add or remove a remote witness of the archive, "
        "serve a remote witness, or make its key",
    )
    parser.add_argument(
        "target", nargs="*", metavar="URL VKEY", help="add: URL and VKEY; remove: VKEY"
    )
    parser.add_argument(
        "--reason", help="why (required for accept, add and remove: recorded in the log)"
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="remove: accept that the archive loses this witness's protection",
    )
    parser.add_argument("--listen", default="127.0.0.1:7380", help="serve: HOST:PORT to bind")
    parser.add_argument("--state", help="serve, keygen: the witness's own folder (key, state)")
    parser.add_argument(
        "--log-key", action="append", default=[], metavar="VKEY", help="serve: a log to witness"
    )
    parser.add_argument("--name", help="keygen: the witness's key name (default: HOSTNAME/witness)")


def _witness(ctx: CommandContext) -> Witness:
    from archive_provider.storage.witness import Witness

    return Witness.for_home(ctx.home)


def _check(ctx: CommandContext, witness: Witness) -> dict[str, Any]:
    from archive_provider.storage.witness import WitnessMismatch

    data: dict[str, Any] = {"archive": str(ctx.archive), "witness": str(witness.path)}
    try:
        record = witness.read()
    except WitnessMismatch as exc:
        return {**data, "ok": False, "problem": str(exc), "recorded": None}
    data["recorded"] = record.as_dict() if record else None
    data["keys"] = _witness_keys(ctx, witness)
    if not ctx.exists():
        return {**data, "ok": record is None, "problem": None if record is None else "no archive"}
    store = ctx.open_store()
    try:
        witness.check(store.conn, store.store_id)
        return {**data, "ok": True, "problem": None, "head": store.head().seq}
    except WitnessMismatch as exc:
        return {**data, "ok": False, "problem": str(exc), "head": store.head().seq}
    finally:
        store.close()


def _witness_keys(ctx: CommandContext, witness: Witness) -> dict[str, Any]:
    """Every witness key this archive relies on: the local witness's cosigner key (as
    C2SP's type 0x04 and as the Ed25519 type 0x01 Go's tools read) and each remote one."""
    from archive_provider.storage.checkpoint_proof import COSIGNER_KEY, cosigner
    from archive_provider.witnesses.remote import witness_set

    local = None
    if (witness.directory / COSIGNER_KEY).is_file():
        try:
            key = cosigner(witness.directory).verifier
            local = {"vkey": key.vkey, "ed25519_vkey": _ed25519_form(key)}
        except OSError as exc:
            local = {"problem": str(exc)}
    remote: list[dict[str, Any]] = []
    if ctx.exists():
        store = ctx.open_store()
        try:
            remote = [{"url": e.url, "vkey": e.vkey} for e in witness_set(store.conn)]
        finally:
            store.close()
    return {"local": local, "remote": remote}


def _ed25519_form(key: Any) -> str:
    from archive_provider.format.signed_note import ALG_ED25519, Verifier

    return Verifier(key.name, ALG_ED25519, key.public_key).vkey


def _human_show(data: dict[str, Any]) -> str:
    recorded = data.get("recorded")
    lines = [f"Witness: {data['witness']}"]
    keys = data.get("keys") or {}
    local = keys.get("local")
    if local and "vkey" in local:
        lines.append(f"Local witness key: {local['vkey']} (Ed25519 form: {local['ed25519_vkey']})")
    elif local:
        lines.append(f"Local witness key: unusable: {local['problem']}")
    lines += [
        f"Remote witness: {r['vkey']} at {r['url'] or 'a peer'}" for r in keys.get("remote", [])
    ]
    if recorded:
        lines.append(
            f"Recorded: store {recorded['store_id']} at seq {recorded['seq']} ({recorded['time']})"
        )
        if recorded.get("accepted"):
            accepted = recorded["accepted"]
            lines.append(f"Last accepted by {accepted.get('user')}: {accepted.get('reason')}")
    else:
        lines.append("Recorded: nothing yet (written after the first checkpoint or clean close)")
    if not data["ok"]:
        lines.append(f"MISMATCH: {data['problem']}")
    elif recorded:
        lines.append("ok: the archive holds the witnessed head")
    else:
        lines.append("ok: nothing to compare yet (no witnessed head)")
    return "\n".join(lines)


def _accept(ctx: CommandContext, witness: Witness, reason: str) -> tuple[dict[str, Any], int]:
    from archive_provider.format.verifier import verify_database
    from archive_provider.projections.registry import default_projections
    from archive_provider.storage.store import EventStore
    from archive_provider.storage.witness import WitnessMismatch, witness_accepted

    if not ctx.exists():
        raise CommandError(f"no archive at {ctx.archive}")
    store = EventStore.open(ctx.archive, create=False, projections=default_projections)
    try:
        report = verify_database(store.conn, store.key)
        if not report.ok:
            return {
                "ok": False,
                "problem": f"the archive fails verification at seq {report.first_bad_seq}: "
                f"{report.problem}. Restore a good copy first; accepting would anchor a "
                "damaged log.",
            }, 1
        try:
            previous = witness.read()
            before: Any = previous.as_dict() if previous else None
        except WitnessMismatch as exc:
            before = {"unreadable": str(exc)}
        event = witness_accepted(store.head(), reason, before)
        (result,) = store.append([event], durable=True)
        new_head = store.head()
        fields = ("reason", "user", "host", "pid", "at")
        accepted = {**{name: event.body[name] for name in fields}, "event_seq": result.seq}
        written = witness.write(
            store.store_id, new_head.seq, new_head.chain, accepted=accepted, force=True
        )
    finally:
        store.close()
    data = {
        "ok": written,
        "event_seq": result.seq,
        "witness": str(witness.path),
        "head": new_head.seq,
        "previous_witness": before,
        "problem": None if written else witness.last_error,
    }
    return data, 0 if written else 1


def _change_set(ctx: CommandContext, reason: str) -> dict[str, Any]:
    """``witness add URL VKEY`` / ``witness remove VKEY --yes``: an event in the log (16.2)."""
    from archive_provider.storage.witness import who
    from archive_provider.witnesses.remote import (
        BadWitness,
        cosigner_key,
        witness_added,
        witness_removed,
        witness_set,
    )

    action, target = ctx.args.action, list(ctx.args.target)
    if action == "add" and len(target) != 2:
        raise UsageError("witness add needs URL VKEY (the witness's cosigner verifier key)")
    if action == "remove" and len(target) != 1:
        raise UsageError("witness remove needs VKEY")
    if action == "remove" and not ctx.args.yes:
        raise UsageError(
            "removing a witness weakens the archive's protection: say so with --yes "
            '(and --reason "why")'
        )
    store = ctx.open_writable()
    try:
        known = {endpoint.vkey for endpoint in witness_set(store.conn)}
        try:
            if action == "add":
                url, vkey = target
                key = cosigner_key(vkey)  # either Ed25519 form: 0x04 or 0x01
                if key.public_key == cosigner_key(store.vkey).public_key:
                    raise BadWitness(f"{vkey} is this archive's own log key, not a witness's")
                if key.vkey in known:
                    raise CommandError(f"{vkey} is already a witness of this archive")
                event = witness_added(url, vkey, reason, who())
            else:
                (vkey,) = target
                if cosigner_key(vkey).vkey not in known:
                    raise CommandError(f"{vkey} is not a witness of this archive")
                event = witness_removed(vkey, reason, who())
        except BadWitness as exc:
            raise CommandError(str(exc)) from None
        (result,) = store.append([event], durable=True)
        witnesses = [{"url": e.url, "vkey": e.vkey} for e in witness_set(store.conn)]
    finally:
        store.close()
    return {"ok": True, "event_seq": result.seq, "witnesses": witnesses}


def run(ctx: CommandContext) -> int:
    from archive_provider.storage.store import StoreError

    if ctx.args.action in ("add", "remove"):
        reason = (ctx.args.reason or "").strip()
        if not reason:
            raise UsageError(f'witness {ctx.args.action} needs --reason "why"')
        try:
            changed = _change_set(ctx, reason)
        except (StoreError, CommandError) as exc:
            changed = {"ok": False, "problem": str(exc)}
        ctx.emit(
            changed,
            lambda d: (
                f"{ctx.args.action}: recorded at seq {d['event_seq']}; "
                f"{len(d['witnesses'])} remote witnesses now"
                if d["ok"]
                else f"NOT changed: {d['problem']}"
            ),
        )
        return 0 if changed["ok"] else 1
    if ctx.args.action in ("serve", "keygen"):
        from archive_provider.commands.witness_serve import run_remote

        return run_remote(ctx)
    witness = _witness(ctx)
    if ctx.args.action == "show":
        try:
            data = _check(ctx, witness)
        except (StoreError, CommandError) as exc:
            data = {
                "ok": False,
                "problem": str(exc),
                "witness": str(witness.path),
                "recorded": None,
            }
        ctx.emit(data, _human_show)
        return 0 if data["ok"] else 1
    reason = (ctx.args.reason or "").strip()
    if not reason:
        raise UsageError('witness accept needs --reason "why this archive is the right one"')
    try:
        data, code = _accept(ctx, witness, reason)
    except (StoreError, CommandError) as exc:
        data, code = {"ok": False, "problem": str(exc)}, 1

    def human(d: dict[str, Any]) -> str:
        if not d["ok"]:
            return f"NOT accepted: {d['problem']}"
        return (
            f"accepted: witness_accepted recorded at seq {d['event_seq']}; the witness "
            f"{d['witness']} now anchors seq {d['head']}"
        )

    ctx.emit(data, human)
    return code
