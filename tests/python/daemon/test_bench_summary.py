"""bench/summary.py, the table at the end of `make bench`: fed RESULT lines written here, it
must show each of issue 11's rows with the median of its values and the right verdict,
name a row no benchmark printed, and refuse malformed lines. (That every row is really
printed by the benchmarks is `make bench-smoke`: bench/run.sh --quick, whose summary fails
on a missing row.)"""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PATH = os.path.join(ROOT, "bench", "summary.py")
_spec = importlib.util.spec_from_file_location("bench_summary", PATH)
summary = importlib.util.module_from_spec(_spec)
sys.modules["bench_summary"] = summary  # (a dataclass looks its module up there)
_spec.loader.exec_module(summary)


def run(lines):
    """(exit status, {label: (value column, target column, verdict)}, whole text)."""
    out = io.StringIO()
    rc = summary.summarise(lines, out)
    labels = {label: name for name, label in summary.EXPECTED}
    rows = {}
    for line in out.getvalue().splitlines():
        # "  <label, 64 wide> <value, 9 wide> <target, 9 wide>  <verdict>"
        label = line[2:66].rstrip()
        if line.startswith("  ") and len(line) > 88:
            rows[labels.get(label, label)] = (line[67:76].strip(), line[77:86].strip(), line[88:])
    rows.pop("row", None)  # the header
    return rc, rows, out.getvalue()


def every_row(value="1", target="-"):
    return [f"RESULT {name} {value} {target}\n" for name, _ in summary.EXPECTED]


def test_every_row_present():
    rc, rows, text = run(["noise line\n"] + every_row())
    assert rc == 0, text
    assert set(rows) == {name for name, _ in summary.EXPECTED}
    assert all(v == ("1", "-", "(no target)") for v in rows.values()), text
    assert "rows missing 0" in text


@pytest.mark.parametrize("value, target, verdict", [
    ("1.1", "<=1.1", "met"),  # the bound itself meets it
    ("1.1001", "<=1.1", "missed"),
    ("0", "<=0", "met"),
    ("0.02", "<=0", "missed"),
    ("300000", ">=300000", "met"),
    ("299999", ">=300000", "missed"),
    ("1e6", ">=1000000", "met"),
    ("nan", "<=2", "missed (nan)"),
    ("-3", "-", "(no target)"),
])
def test_verdict(value, target, verdict):
    lines = [line for line in every_row() if " py.relu_numpy " not in line]
    rc, rows, text = run(lines + [f"RESULT py.relu_numpy {value} {target}\n"])
    assert rc == 0, text
    assert rows["py.relu_numpy"][1:] == (target, verdict), text


def test_counts_of_met_and_missed():
    lines = every_row()[2:] + ["RESULT train.mlp_adam.local 0.9 <=1.1\n",
                               "RESULT train.mlp_adam.rpc 4.9 >=5\n",
                               "RESULT extra.row 7 >=5\n"]
    rc, rows, text = run(lines)
    assert rc == 0, text
    assert rows["train.mlp_adam.local"] == ("0.9", "<=1.1", "met")
    assert rows["train.mlp_adam.rpc"] == ("4.9", ">=5", "missed")
    assert rows["extra.row"] == ("7", ">=5", "met")  # a row not in the list is shown too
    assert "targets met 2, missed 1; rows missing 0" in text


def test_median_of_runs():
    lines = [f"RESULT train.mlp_adam.local {v} <=1.1\n" for v in (3.0, 1.2, 0.5, 9.0, 1.0)]
    rc, rows, text = run(every_row() * 5 + lines)
    assert rc == 2  # every_row's target for it is "-"
    lines = [line for line in every_row() * 5 if " train.mlp_adam.local " not in line] + lines
    rc, rows, text = run(lines)
    assert rc == 0, text
    assert rows["train.mlp_adam.local"] == ("1.2", "<=1.1", "missed"), text
    assert "median of 5 runs" in text


def test_a_row_printed_in_fewer_runs_is_marked():
    lines = every_row() * 3 + ["RESULT c.other 5 -\n"]
    rc, rows, text = run(lines)
    assert rc == 0
    assert rows["c.other"] == ("5", "-", "(no target) (1 run)"), text


def test_missing_row_is_named_and_fails():
    lines = [line for line in every_row() if " memfd.download " not in line]
    rc, rows, text = run(lines)
    assert rc == 1
    assert rows["memfd.download"] == ("-", "", "MISSING"), text
    assert text.rstrip().endswith("rows missing 1: memfd.download"), text


def test_skipped_rows_are_not_missing():
    lines = [line for line in every_row() if " train." not in line]
    rc, rows, text = run(lines + ["SKIP train.* torch is not installed\n"])
    assert rc == 0, text
    assert rows["train.conv.rpc"] == ("-", "", "skipped: torch is not installed"), text
    # a prefix skips only the rows it names
    lines = [line for line in every_row() if " rpc." not in line and " train.conv" not in line]
    rc, rows, text = run(lines + ["SKIP rpc.* no torch\n"])
    assert rc == 1
    assert rows["train.conv.local"][2] == "MISSING", text
    assert rows["rpc.tiny"][2] == "skipped: no torch", text
    # a name without a star skips that row only, not the rows it begins
    lines = [line for line in every_row() if " train.mlp_adam." not in line]
    rc, rows, text = run(lines + ["SKIP train.mlp no torch\n", "SKIP train.mlp_adam.rpc x\n"])
    assert rc == 1
    assert rows["train.mlp_adam.local"][2] == "MISSING", text
    assert rows["train.mlp_adam.rpc"][2] == "skipped: x", text


@pytest.mark.parametrize("bad", [
    "RESULT c.other 1.0\n",  # no target
    "RESULT c.other one <=1.1\n",
    "RESULT C.Other 1.0 <=1.1\n",  # the name's alphabet
    "RESULT c.other 1.0 <1.1\n",
    "RESULT c.other 1.0 <=1.1 extra\n",
    "SKIP train.*\n",  # no reason
])
def test_malformed_line_fails(bad):
    rc, _, text = run(every_row() + [bad])
    assert rc == 2
    assert "summary: line" in text


def test_a_target_that_changes_between_lines_fails():
    rc, _, text = run(every_row() + ["RESULT py.relu_numpy 1 <=1.3\n"])
    assert rc == 2
    assert "py.relu_numpy's target <=1.3 differs from -" in text


def test_command_line_reads_files(tmp_path):
    log = tmp_path / "log"
    log.write_text("".join(every_row("2", ">=1")))
    p = subprocess.run([sys.executable, PATH, str(log)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"targets met {len(summary.EXPECTED)}, missed 0" in p.stdout
    p = subprocess.run([sys.executable, PATH], input="RESULT c.other 1 -\n", capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and "MISSING" in p.stdout
