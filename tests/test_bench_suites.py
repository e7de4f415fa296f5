"""The suites of issues 48 and 50 in ``make bench`` (benchmarks/suites.py, benchmarks/run.py): --suites, the rows each
script writes going into NAME.json and NAME.md, their targets, and a run stopped half-way keeping what finished. One
test runs every script for real at tiny sizes (one round, a few steps); no timing is asserted anywhere."""
from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks import suites
from tullax.backends import availability

C_USABLE = any(name == "c" and ok for name, ok, _ in availability())


def test_the_suites_option_names_the_suites_and_quick_shrinks_every_one():
    assert suites.parse_suites(None) == suites.parse_suites("all") == ["programs", "scan", "loop7024"]
    assert suites.parse_suites("none") == []
    assert suites.parse_suites(" Scan, loop7024,scan") == ["scan", "loop7024"]
    with pytest.raises(SystemExit, match="unknown suite nope.*programs, scan, loop7024"):
        suites.parse_suites("scan,nope")
    full = {name: suites.suite_commands(suite, "c", False) for name, suite in suites.SUITES.items()}
    quick = {name: suites.suite_commands(suite, "c", True) for name, suite in suites.SUITES.items()}
    assert all(cmd[-2:] == ["--backend", "c"] for cmds in (*full.values(), *quick.values()) for cmd in cmds)
    assert [c for c in quick["programs"][0] if c == "--quick"] and "--quick" not in full["programs"][0]
    assert ["--complex" in c for c in full["scan"]] == ["--complex" in c for c in quick["scan"]] == [False, True]
    assert all("1024" not in c for c in quick["scan"]) and "--lengths" not in full["scan"][0]  # 64, 256, 1024
    assert quick["loop7024"][0][quick["loop7024"][0].index("--steps") + 1] == "1000"
    assert "--steps" not in full["loop7024"][0]  # the script's 8000


def _entry(suite: str, rows: list[dict], status: str = "ok", backend: str = "c") -> dict:
    return {"suite": suite, "backend": backend, "status": status, "wall_s": 1.0, "quick": False, "commands": [],
            "records": {}, "rows": rows}


def _scan(T: int, op: str, vs_scan: float, vs_associative: float, lam: str = "float32") -> dict:
    return {"T": T, "op": op, "lam": lam, "tullax_ms": 1.0, "lax.scan_ms": vs_scan,
            "associative_scan_ms": vs_associative, "vs_scan": vs_scan, "vs_associative": vs_associative}


def _program(program: str, op: str, jnp: float, unfused: float) -> dict:
    return {"program": program, "op": op, "fused_ms": 1.0, "jnp_ms": jnp, "unfused_ms": unfused,
            "jnp_over_fused": jnp, "unfused_over_fused": unfused, "fused": True, "not_fused_because": ""}


def test_suite_rows_become_tables_and_their_targets_count_the_worst_row():
    from benchmarks.report import check_targets, targets_markdown

    entries = [
        _entry("scan", [_scan(64, "forward", 2.5, 4.0), _scan(1024, "forward", 3.0, 1.9, "complex64"),
                        _scan(64, "grad", 2.2, 3.0), _scan(64, "jacfwd_lam", 9.0, 20.0)]),
        _entry("programs", [_program("layernorm", "forward", 1.2, 1.5), _program("softmax", "forward", 1.0, 1.0),
                            _program("layernorm", "grad", 0.9, 30.0)]),
        _entry("loop7024", [{"op": "forward", "tullax ms": 1.0, "lax.scan ms": 0.6, "lax.scan / tullax": 0.6}]),
        _entry("scan", [_scan(64, "forward", 9.0, 9.0)], status="crashed (exit status 1)", backend="auto"),
    ]
    found = {(status, backend, target.text.split(" >=")[0].split(" faster")[0].split(" against")[0]): measured
             for status, backend, target, measured in suites.suite_verdicts(entries)}
    assert found[("FAIL", "c", "scan forward")] == "1.90x (T=1024 complex64)"  # the faster of the two comparators
    assert found[("PASS", "c", "scan grad")] == "2.20x (T=64 float32)"
    assert found[("PASS", "c", "scan jacfwd w.r.t. lam")] == "9.00x (T=64 float32)"
    assert found[("MISSING", "c", "scan jacrev w.r.t. lam")] == "no jacrev_lam row"
    assert found[("PASS", "c", "programs forward")] == "1.00x (softmax)"  # >= 1x jnp
    assert found[("FAIL", "c", "programs forward")] == "1.00x (softmax)"  # not faster than the separate kernels
    assert found[("FAIL", "c", "programs backward")] == "0.90x (layernorm)"
    assert found[("PASS", "c", "programs backward")] == "30.00x (layernorm)"
    assert found[("INFO", "c", "issue 7024's loop forward")] == "0.60x"
    assert found[("MISSING", "c", "issue 7024's loop gradient")] == "no grad row"
    assert all(status == "MISSING" and measured == "crashed (exit status 1)"
               for (status, backend, _), measured in found.items() if backend == "auto")

    doc = {"config": {"backends": ["xla", "c"]}, "cases": [], "suites": entries}
    verdicts = check_targets(doc)  # no case ran: the suites' targets alone
    assert len(verdicts) == 4 + 4 + 2 + 4  # c: scan, programs, loop7024; auto: scan
    assert targets_markdown(verdicts, quick=False).startswith("## Targets (issues 3, 14, 48 and 50)")
    table = suites.suites_markdown(entries)
    titles = ("## Programs (issue 50)", "## Recurrences (issue 48)", "## Issue 7024's loop")
    assert [table.index(title) for title in titles] == sorted(table.index(title) for title in titles)
    assert "| c | float32 | 64 | forward | 1 ms | 2.5 ms | 4 ms | 2.50x | 4.00x |" in table
    assert "| c | softmax | forward | 1 ms | 1 ms | 1 ms | 1.00x | 1.00x | - |" in table
    assert "| c | forward | 1 ms | 600 µs | — | 0.60x | — |" in table
    assert "- auto: crashed (exit status 1)" in table
    assert suites.suites_markdown([]) == ""


def test_an_interrupted_run_keeps_the_suites_that_finished(tmp_path, monkeypatch):
    """No process starts: each suite's run is replaced by its entry, and Ctrl-C comes during the second."""
    from benchmarks.run import main

    done = []

    def fake(suite, backend, quick, timeout_s, on_line):
        if done:
            raise KeyboardInterrupt
        done.append(suite.name)
        on_line("a line the script printed\n")
        return _entry(suite.name, [_program("softmax", "forward", 1.5, 2.0)], backend=backend)

    monkeypatch.setattr(suites, "run_suite", fake)
    argv = ["--cases", "none", "--backends", "c", "--suites", "programs,scan", "--quiet", "--no-plot",
            "--out-dir", str(tmp_path), "--name", "t"]
    assert main(argv) == 130
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["complete"] is False and doc["config"]["suites"] == ["programs", "scan"]
    assert [(e["suite"], e["backend"]) for e in doc["suites"]] == [("programs", "c")]
    assert "| c | softmax | forward |" in (tmp_path / "t.md").read_text()
    assert "partial results" in (tmp_path / "t.md").read_text()


@pytest.mark.slow  # three scripts in processes of their own, each importing jax and compiling its kernels
@pytest.mark.skipif(not C_USABLE, reason="needs the c backend")
def test_run_py_runs_every_suite_script_and_writes_its_rows(tmp_path, monkeypatch):
    """The real scripts in their own processes, at tiny sizes and one round (the registry's quick arguments
    replaced): each suite's rows land in NAME.json and its table in NAME.md, and --check-targets judges them."""
    from benchmarks.run import main

    tiny = {"programs": ("--rounds", "1", "--quick", "--programs", "softmax"),
            "scan": ("--lengths", "8", "--rounds", "1", "--jac-rounds", "1", "--ops", "forward", "grad"),
            "loop7024": ("--rounds", "1", "--steps", "16", "--subjects", "tullax")}
    for name, args in tiny.items():
        monkeypatch.setitem(suites.SUITES, name, dataclasses.replace(suites.SUITES[name], quick=(args,)))
    status = main(["--quick", "--cases", "none", "--backends", "c", "--suites", "programs,scan,loop7024", "--quiet",
                   "--no-plot", "--out-dir", str(tmp_path), "--name", "t", "--check-targets"])
    assert status == 1  # the jacobians were not timed: their targets are MISSING
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["complete"] is True and doc["cases"] == []
    entries = {entry["suite"]: entry for entry in doc["suites"]}
    assert list(entries) == ["programs", "scan", "loop7024"]
    for entry in entries.values():
        assert entry["status"] == "ok" and entry["backend"] == "c", entry
    assert [(r["program"], r["op"]) for r in entries["programs"]["rows"]] == [("softmax", "forward"),
                                                                           ("softmax", "grad")]
    assert all(r["fused_ms"] > 0 and r["jnp_ms"] > 0 for r in entries["programs"]["rows"])
    assert [(r["T"], r["op"], r["lam"]) for r in entries["scan"]["rows"]] == [(8, "forward", "float32"),
                                                                           (8, "grad", "float32")]
    assert [r["op"] for r in entries["loop7024"]["rows"]] == ["forward", "grad"]
    assert entries["loop7024"]["records"]["steps"] == 16
    assert entries["loop7024"]["rows"][0]["lax.scan / tullax"] > 0
    text = (tmp_path / "t.md").read_text()
    for title in ("## Programs (issue 50)", "## Recurrences (issue 48)", "## Issue 7024's loop", "## Targets"):
        assert title in text
    assert "| MISSING | c | scan jacfwd w.r.t. lam" in text
