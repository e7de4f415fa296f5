"""Two saved runs of the benchmark suite (``benchmarks/run.py``'s json) side by side: per case and tullax backend,
forward and backward time of the new run over the old (below 1: faster now), as measured and relative to the same
run's XLA (the backend's time over XLA's in each run, new over old: what a different load on a shared machine moves
less, as XLA's own code did not change). Writes NAME.md beside the new run.

    python benchmarks/compare_runs.py benchmarks/results/latest.json benchmarks/results/NEW.json [--backends c,auto]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _rows(doc: dict) -> dict[tuple[str, str], dict]:
    return {(case["name"], backend): result for case in doc["cases"] for backend, result in case["results"].items()}


def compare(old: dict, new: dict, backends: list[str]) -> list[dict]:
    """Per case, backend and direction: the old and new ms, new/old and new/old relative to each run's XLA."""
    before, after = _rows(old), _rows(new)
    found = []
    for (case, backend), row in after.items():
        if backend not in backends or (case, backend) not in before:
            continue
        for way in ("fwd", "bwd"):
            key = f"{way}_ms"
            was, now = before[(case, backend)].get(key), row.get(key)
            xla_was, xla_now = before.get((case, "xla"), {}).get(key), after.get((case, "xla"), {}).get(key)
            if not was or not now:
                continue
            relative = (now / xla_now) / (was / xla_was) if xla_was and xla_now else None
            found.append({"case": case, "backend": backend, "kernel": "forward" if way == "fwd" else "backward",
                          "old_ms": was, "new_ms": now, "new/old": now / was, "new/old vs xla": relative})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--backends", default="c,auto,numba")
    args = parser.parse_args()
    old, new = (json.loads(Path(path).read_text()) for path in (args.old, args.new))
    rows = compare(old, new, args.backends.split(","))
    commits = [doc["machine"].get("git_commit", "?") for doc in (old, new)]
    lines = [f"# {Path(args.new).name} against {Path(args.old).name} (commits {commits[0]} -> {commits[1]})", "",
             f"`python benchmarks/compare_runs.py {args.old} {args.new} --backends {args.backends}`. new/old: the "
             "new run's time over the old one's (< 1: faster now); vs xla: the same with each time over its own "
             "run's XLA time (a load that differs between the runs moves it less).", "",
             "| case | backend | kernel | old | new | new/old | new/old vs xla |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        relative = "n/a" if r["new/old vs xla"] is None else f"{r['new/old vs xla']:.2f}"
        lines.append(f"| {r['case']} | {r['backend']} | {r['kernel']} | {r['old_ms']:.3g} ms | {r['new_ms']:.3g} ms "
                     f"| {r['new/old']:.2f} | {relative} |")
    out = Path(args.new).with_name(Path(args.new).stem + "-vs-" + Path(args.old).stem + ".md")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
