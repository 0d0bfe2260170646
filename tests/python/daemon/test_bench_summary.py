"""bench/summary.py, the table at the end of `make bench`: fed RESULT lines written here, it
must show each of the rows with the median, min and max of its values, its number of
turns and the right verdict (flagged unsure when the spread is wider than the margin to the
target), name a row no benchmark printed, refuse malformed lines, and write the same table as
markdown headed by the run's machine and loads. (That every row is really
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
    """(exit status, {label: (median column, target column, verdict)}, whole text)."""
    out = io.StringIO()
    rc = summary.summarise(lines, out)
    labels = {label: name for name, label in summary.EXPECTED}
    rows = {}
    for line in out.getvalue().splitlines():
        # "  <label, 64> <median, 9> <target, 9> <min, 9> <max, 9> <turns, 5>  <verdict>"
        label = line[2:66].rstrip()
        if line.startswith("  ") and len(line) > 114:
            rows[labels.get(label, label)] = (line[67:76].strip(), line[77:86].strip(), line[114:])
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
    assert "targets met 2, missed 1; unsure 0; rows missing 0" in text


def test_median_of_runs():
    lines = [f"RESULT train.mlp_adam.local {v} <=1.1\n" for v in (3.0, 1.2, 0.5, 9.0, 1.0)]
    rc, rows, text = run(every_row() * 5 + lines)
    assert rc == 2  # every_row's target for it is "-"
    lines = [line for line in every_row() * 5 if " train.mlp_adam.local " not in line] + lines
    rc, rows, text = run(lines)
    assert rc == 0, text
    assert rows["train.mlp_adam.local"] == (
        "1.2", "<=1.1", "missed, unsure: spread 8.5 > margin 0.1"), text
    assert "of 5 turns" in text
    line = next(x for x in text.splitlines() if x.startswith("  MLP 64-128-10 Adam step: tensordd"))
    assert line[77:113].split() == ["<=1.1", "0.5", "9", "5"], line  # target, min, max, turns


def test_a_spread_inside_the_margin_is_sure():
    lines = [line for line in every_row() * 3 if " train.mlp_adam.local " not in line]
    rc, rows, text = run(lines + [f"RESULT train.mlp_adam.local {v} <=1.1\n"
                                  for v in (0.8, 0.9, 0.85)])
    assert rc == 0, text
    assert rows["train.mlp_adam.local"] == ("0.85", "<=1.1", "met"), text
    assert "unsure 0;" in text


def test_a_row_printed_in_fewer_runs_is_marked():
    lines = every_row() * 3 + ["RESULT c.other 5 -\n"]
    rc, rows, text = run(lines)
    assert rc == 0
    assert rows["c.other"] == ("5", "-", "(no target)"), text
    line = next(x for x in text.splitlines() if x.startswith("  c.other "))
    assert line.split()[1:6] == ["5", "-", "5", "5", "1"], line  # median, target, min, max, turns


def test_missing_row_is_named_and_fails():
    lines = [line for line in every_row() if " memfd.download " not in line]
    rc, rows, text = run(lines)
    assert rc == 1
    assert rows["memfd.download"] == ("-", "", "MISSING"), text
    assert text.rstrip().endswith("rows missing 1: memfd.download"), text


def test_markdown_table(tmp_path):
    log = ["machine: 2 cores, 24 GiB, Linux 6.1\n", "cpu:     Some CPU 7000\n",
           "commit:  abc1234\n", "command: bench/run.sh --runs 3\n",
           "== turn 1 of 3, 10:00:00 UTC, load average 1.50 1.20 0.90\n",
           "== turn 2 of 3, 10:05:00 UTC, load average 2.00 1.50 1.00\n"]
    lines = [line for line in every_row() * 3 if " train.conv.local " not in line]
    lines += [f"RESULT train.conv.local {v} <=1.1\n" for v in (1.0, 1.3, 1.2)]
    md = tmp_path / "RESULTS.md"
    summary.markdown(log + lines, str(md), date="2026-12-02 10:10 UTC")
    text = md.read_text()
    assert "- cpu: Some CPU 7000" in text and "- commit: abc1234" in text
    assert "turn 1 of 3 10:00:00: 1.50 1.20 0.90" in text
    row = next(x for x in text.splitlines() if "`train.conv.local`" in x)
    assert [c.strip() for c in row.split("|")[2:8]] == [
        "1", "1.2", "1.3", "3", "&lt;=1.1", "missed, unsure: spread 0.3 > margin 0.1"], row


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
