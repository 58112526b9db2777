"""``python -m bench [--smoke|--quick|--full] [--json OUT]``: every benchmark row, one table.

``python -m bench --huge [--events N] --workdir DIR`` builds (or resumes) one 10M-event log
and measures the whole-archive paths on it (bench/huge.py; not part of the modes).

Each row holds the project's figure, a baseline measured in the same run, their ratio and
the target; see docs/PERFORMANCE.md for what each number means. Big logs are built with
bulk appends in 5,000-event transactions and without projections (setup
only, never how the project writes); the replay of row 5 then builds their projections
with the project's own code, and every measurement runs at the project's own settings.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from archive_provider.storage.store import archive_dir

from . import (
    s1_append,
    s2_verify,
    s3_provider,
    s3_spill,
    s4_checkpoint,
    s6_recall,
    s7_storage,
    s8_holographic,
    s9_startup,
    s10_witness,
    s12_v2,
    s13_bundle,
    s14_report,
)
from .common import Row, Workdir, machine, quiet_logging, table
from .config import MODES, Config
from .workload import build_log, copy_log, corpus

LOG_SEED = 100  # the big logs' corpus seed (stage i: LOG_SEED + i)


def _revision() -> dict[str, Any]:
    """The commit measured, and which project files differed from it (others work live)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout

    changed = [
        line[3:] for line in git("status", "--short", "--", "archive_provider").splitlines() if line
    ]
    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "uncommitted_project_files": changed,
    }


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _replay_rows(folder: Path, label: str, events: int) -> tuple[list[Row], dict[str, Any]]:
    """Row 5 through the replay engineer's bench/replay_bench.py (children, peak RSS each)."""
    for path in folder.iterdir():  # warm the page cache for both children alike
        if path.is_file():
            with open(path, "rb") as handle:
                while handle.read(1 << 24):
                    pass
    from . import replay_bench  # its children report VmHWM, so this process's size is moot

    base = replay_bench._child("baseline", folder)
    rebuilt = replay_bench._child("replay", folder)
    _say(
        f"  replay @ {label}: {rebuilt['seconds']:.1f} s vs raw {base['seconds']:.1f} s; "
        f"peak RSS {rebuilt['peak_rss_mb']:.0f} MiB vs {base['peak_rss_mb']:.0f} MiB"
    )
    count = rebuilt["events"]
    rows = [
        Row(
            "5",
            f"replay all projections, {label}",
            count / rebuilt["seconds"],
            "events/s",
            count / base["seconds"],
            "read+decode+FTS5 insert",
            target_kind="min",
            target_value=0.8,
            target_text=">= 0.8x raw (replay_bench)",
            extra={
                "seconds": rebuilt["seconds"],
                "raw_seconds": base["seconds"],
                "cpu_ratio": base["cpu_seconds"] / rebuilt["cpu_seconds"],
            },
        ),
        Row(
            "5",
            f"replay peak RSS, {label}",
            rebuilt["peak_rss_mb"],
            "MiB",
            base["peak_rss_mb"],
            "raw floor peak RSS",
            extra={
                "rss_samples_mb": rebuilt.get("rss_samples_mb"),
                "idle_rss_mb": rebuilt.get("idle_rss_mb"),
            },
        ),
    ]
    return rows, {"replay": rebuilt, "baseline": base}


def run(config: Config, workdir: Path | None, only: set[str] | None) -> dict[str, Any]:
    started = time.perf_counter()
    text, source = corpus(7)
    work = Workdir(workdir)
    rows: list[Row] = []
    info: dict[str, Any] = {"corpus": source, "logs": {}, "workdir": str(work.root)}

    def want(section: str) -> bool:
        return only is None or section in only

    def section(title: str) -> None:
        _say(f"[{time.perf_counter() - started:6.1f}s] {title}")

    try:
        with quiet_logging():
            if want("1"):
                section("1 append throughput")
                rows += s1_append.run(work, text, config.append, config.repeats, _say)
            if want("3"):
                section("3 sustained ingest through the provider")
                rows += s3_provider.ingest_rows(work, text, config.ingest, config.repeats, _say)
                section("3 the spill: overload, journal, shutdown, loss window")
                rows += s3_spill.spill_rows(
                    work, text, config.sync_calls, config.spill_pending, _say
                )
            if want("4"):
                section("4 durable checkpoints")
                rows += s4_checkpoint.run(
                    work, text, config.checkpoints, config.checkpoint_repeats, _say
                )
            if want("10"):
                section("10 witnesses: cosign round trip, consistency proofs")
                rows += s10_witness.run(work, config.witness_leaves, config.witness_cosigns, _say)
            if want("12"):
                section("12 v2: signed durable commit")
                rows.append(s12_v2.commit_row(work, config.commit_repeats, _say))
            if want("7"):
                section("7 storage: re-sent transcripts")
                rows += s7_storage.resend(work, text, config.resend_turns, _say)

            uses_logs = {"2", "3", "5", "6", "7", "8", "12", "13", "14"}
            big = uses_logs & (only or uses_logs)
            homes: dict[int, Path] = {}
            if big:
                # the big logs: each size continues the previous one (copied first)
                previous: Path | None = None
                built_turns = built_events = 0
                for index, events in enumerate(config.log_sizes):
                    home = work.fresh(f"log-{events}")
                    if previous is not None:
                        copy_log(archive_dir(previous), archive_dir(home))
                    turns = (
                        round(events * 40 / 43) - built_turns
                    )  # corpus sessions: 40 turns + 3 events
                    section(
                        f"building a log of ~{events:,} events ({turns:,} more turns; "
                        "5,000-event transactions, setup only)"
                    )
                    built = build_log(
                        archive_dir(home),
                        turns,
                        seed=LOG_SEED + index,
                        projections=False,
                        plants=s6_recall.plants(index, turns),  # row 6's quality row asks
                    )
                    built_turns += turns
                    built_events += built.events
                    info["logs"][str(events)] = {
                        "turns": built_turns,
                        "events": built_events,
                        "seconds": round(built.seconds, 1),  # this stage (it continues the last)
                    }
                    homes[events] = home
                    previous = home
            if homes:
                size = max(homes)
                home = homes[size]
                folder = archive_dir(home)
                db = folder / "events.db"
                label = s3_provider.size_label(size).removeprefix("log of ")
                if want("2"):
                    section(f"2 verify @ {label}")
                    verify_rows = s2_verify.run(folder, size, config.verify_repeats, _say)
                    rows += verify_rows
                    rows += s2_verify.jobs_rows(folder, 2, config.verify_repeats, _say)
                    rows.append(
                        s2_verify.eventsourcing_row(
                            work,
                            text,
                            config.verify_es,
                            config.repeats,
                            verify_rows[0].figure,
                            _say,
                        )
                    )
                if want("14"):
                    section("14 the audit report (hermes-archive report) on each big log")
                    rows += s14_report.run(homes, _say)
                # the big log was appended without projections; the replay (row 5) builds them
                section(f"5 replay @ {label} (builds the projections the next rows read)")
                replay_rows, info["replay"] = _replay_rows(folder, label, size)
                if want("5"):
                    rows += replay_rows
                if want("7"):
                    section(f"7 storage per turn @ {label}")
                    rows += s7_storage.per_turn(db, label, _say)
                holo = None
                if want("8"):
                    section(f"8 holographic peer: bulk fill to the same size @ {label}")
                    holo = work.fresh("holographic") / "memory_store.db"
                    info["holographic_facts"] = s8_holographic.build(
                        holo, s8_holographic.turn_texts(db)
                    )
                    _say(f"  filled with {info['holographic_facts']:,} facts")
                samples: dict[int, dict[str, list[float]]] = {}
                # a fresh log whose sync_turn is timed beside each big log's, call by call
                beside = (
                    s3_provider.open_provider(work.fresh("latency-beside"), "bench-beside")
                    if want("3")
                    else None
                )
                for events, log_home in sorted(homes.items()):
                    section(f"provider on the log of {events:,} events (opening verifies it)")
                    opened = time.perf_counter()
                    provider = s3_provider.open_provider(log_home, f"bench-open-{events}")
                    if events == size:
                        rows.append(
                            Row(
                                "3",
                                f"provider open to first commit, {label}: first open (no witness yet)",
                                time.perf_counter() - opened,
                                "s",
                                note="info: the bulk-built log is proven before the first commit",
                            )
                        )
                    try:
                        if events == size and (want("6") or want("8")):
                            ordinary = [text.query() for _ in range(config.queries)]
                            common = [text.common_query() for _ in range(config.queries)]
                            section(f"6 prefetch / archive_search @ {label}")
                            recall_rows, searched = s6_recall.run(
                                provider, db, label, ordinary, common, _say
                            )
                            if want("6"):
                                rows += recall_rows
                                rows.append(
                                    s6_recall.quality(provider, db, len(homes), label, _say)
                                )
                            if holo is not None:
                                section(f"8 holographic add and search @ {label}")
                                ours = s3_provider.ingest_on(
                                    provider, text, 500, config.holo_adds * 5, "at-size"
                                )
                                theirs = s8_holographic.add_rate(holo, text, config.holo_adds)
                                rows += s8_holographic.rows_for(
                                    label,
                                    holo,
                                    ours,
                                    theirs,
                                    searched,
                                    {"ordinary": ordinary, "common-word": common},
                                    _say,
                                )
                        if want("3"):
                            section(f"3 sync_turn latency @ {s3_provider.size_label(events)}")
                            samples[events] = s3_provider.measure_latency(
                                provider, text, config.sync_calls, f"{events}", beside
                            )
                    finally:
                        provider.shutdown()
                if beside is not None:
                    beside.shutdown()
                if want("3"):
                    opened = time.perf_counter()
                    s3_provider.open_provider(homes[size], "bench-reopen").shutdown()
                    rows.append(
                        Row(
                            "3",
                            f"provider open to first commit, {label}: re-open after clean close",
                            time.perf_counter() - opened,
                            "s",
                            note="info: the clean-close fingerprint spares the full verify",
                        )
                    )
                    empty = work.fresh("latency-empty")
                    provider = s3_provider.open_provider(empty, "bench-open-0")
                    try:
                        samples[0] = s3_provider.measure_latency(
                            provider, text, config.sync_calls, "0"
                        )
                    finally:
                        provider.shutdown()
                    rows += s3_provider.latency_rows(samples, _say)
                if want("12"):
                    section(f"12 v2: proof of one turn @ {label}, open after a crash")
                    rows += s12_v2.proof_rows(work, folder, size, config.proof_repeats, _say)
                    rows += s12_v2.open_rows(
                        {n: archive_dir(h) for n, h in homes.items()}, config.crash_repeats, _say
                    )
                if want("13"):
                    section(f"13 export and verify-bundle @ {label}")
                    rows += s13_bundle.run(work, home, folder, label, config.verify_repeats, _say)
            if want("9"):
                section("9 CLI start-up")
                rows += s9_startup.run(work, config.startup_repeats, _say)
    finally:
        work.cleanup()
    rows.sort(key=lambda r: int(r.section))
    info["seconds"] = round(time.perf_counter() - started, 1)
    return {"rows": rows, "info": info}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    for name in MODES:
        size.add_argument(f"--{name}", dest="mode", action="store_const", const=name)
    size.add_argument(
        "--huge",
        action="store_true",
        help="build (or resume) a 10M-event log under --workdir and measure it (bench/huge.py)",
    )
    parser.add_argument("--events", type=int, default=10_000_000, help="--huge: log size")
    parser.add_argument(
        "--export-cap-mib",
        type=int,
        default=2048,
        help="--huge: address-space cap of the export child",
    )
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument(
        "--workdir", type=Path, help="scratch folder (default: the system temp folder)"
    )
    parser.add_argument("--only", help="comma-separated row numbers to run (e.g. 2,6)")
    args = parser.parse_args(argv)
    if args.huge:
        from . import huge

        return huge.main(args.events, args.workdir, args.export_cap_mib)
    config = MODES[args.mode or "quick"]
    only = set(args.only.split(",")) if args.only else None
    meta = machine()
    meta["revision"] = _revision()
    command = "python -m bench " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    _say(f"hermes-archive bench ({config.name}) on {meta['cpu']}, {meta['cores']} cores")
    cpu = time.process_time()
    result = run(config, args.workdir, only)
    result["info"]["cpu_seconds_main_process"] = round(time.process_time() - cpu, 1)
    rows: list[Row] = result["rows"]
    print(table(rows))
    missed = [r for r in rows if r.met is False]
    print(
        f"\n{len(rows)} rows, {sum(r.met is True for r in rows)} targets met, {len(missed)} missed "
        f"({result['info']['seconds']} s, corpus: {result['info']['corpus']})"
    )
    if args.json:
        payload = {
            "mode": config.name,
            "command": command.strip(),
            "machine": meta,
            "info": result["info"],
            "rows": [r.as_dict() for r in rows],
            "missed": [f"{r.section} {r.name}" for r in missed],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
