"""`profiler match`: inputs (files, capture and run directories), table, CSV, unmatched file, errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from profiler.cli import main

PROFILE = "Kafka: KafkaConsumer\nDeserialize: JacksonParser\nGC: GC Thread\n"


@pytest.fixture()
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile.txt"
    path.write_text(PROFILE, encoding="utf-8")
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_folded_file_table_csv_and_unmatched(tmp_path: Path, profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stacks = write(
        tmp_path / "a.folded",
        "Executor task l;x.KafkaConsumer.poll 6\nExecutor task l;a.JacksonParser.parse 3\n"
        "Executor task l;Foo.bar 1\nt;Baz.qux;leaf_[k] 2\n",
    )
    out_csv = tmp_path / "tasks.csv"
    unmatched = tmp_path / "unmatched.folded"
    code = main(["match", "--profile", str(profile), str(stacks), "--csv", str(out_csv), "--unmatched", str(unmatched)])
    assert code == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "Kafka" in printed and "50.00 % ±" in printed  # 6 of 12
    # the table is the data on stdout; what was written and the next step go to stderr
    assert f"wrote {out_csv}" in captured.err and "next:" in captured.err
    assert "wrote" not in printed and "next:" not in printed
    assert "unmatched" in printed and "Baz.qux" in printed  # candidate pattern skips the kernel leaf
    with out_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["task"], r["samples"], r["share"]) for r in rows] == [
        ("Kafka", "6", "0.5"), ("Deserialize", "3", "0.25"), ("GC", "0", "0"), ("unmatched", "3", "0.25"),
    ]
    assert unmatched.read_text().splitlines() == ["t;Baz.qux;leaf_[k] 2", "Executor task l;Foo.bar 1"]


def test_capture_and_run_directories(tmp_path: Path, profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    write(run / "hosts" / "h1" / "pids" / "100" / "stacks.folded", "GC Thread#0;x 4\n")
    write(run / "hosts" / "h2" / "pids" / "200" / "stacks.folded", "t;JacksonParser.p 4\n")
    out_csv = tmp_path / "out.csv"
    assert main(["match", "--profile", str(profile), str(run), "--csv", str(out_csv)]) == 0
    assert "2 stack file(s)" in capsys.readouterr().out
    assert "GC,4,0.5" in out_csv.read_text()
    # one capture directory, and the same file named twice counts once
    capture = run / "hosts" / "h1"
    assert main(["match", "--profile", str(profile), str(capture), str(capture / "pids/100/stacks.folded")]) == 0
    assert "1 stack file(s)" in capsys.readouterr().out


def test_explain_without_stacks(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["match", "--profile", str(profile), "--explain", "GC Thread#0;a.KafkaConsumer.poll;b"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Kafka: frame 1 'a.KafkaConsumer.poll' matches KafkaConsumer")
    assert "GC" in out


def test_default_profile_is_the_shipped_spark_profile(repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["match", str(repo_root / "tests/data/spark_executor_synthetic.folded")]) == 0
    out = capsys.readouterr().out
    assert "spark_structured_streaming.txt" in out and "Filter+Projection+Join" in out


@pytest.mark.parametrize(
    "make_args, message, code",
    [
        (lambda d, p: ["--profile", str(p)], "nothing to match", 2),
        (lambda d, p: ["--profile", str(p), str(d)], "no pids/*/stacks.tpc or pids/*/stacks.folded below", 2),
        (lambda d, p: ["--profile", str(write(d / "bad.txt", "A: re:(\n")), str(write(d / "s.folded", "a 1\n"))],
         "bad.txt:1: invalid regular expression", 2),
        (lambda d, p: ["--profile", str(p), str(write(d / "s.folded", "a;b notacount\n"))],
         "s.folded:1: not a folded stack line", 6),
        (lambda d, p: ["--profile", str(p), str(write(d / "s.folded", "a 1\n")), "--csv", str(write(d / "x.csv", ""))],
         "x.csv: exists; choose another --csv or add --force", 5),
    ],
)
def test_errors_are_one_line(
    tmp_path: Path, profile: Path, capsys: pytest.CaptureFixture[str], make_args: object, message: str, code: int
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    args = make_args(empty, profile)  # type: ignore[operator]
    assert main(["match", *args]) == code
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_missing_input_is_an_argument_error(tmp_path: Path, profile: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["match", "--profile", str(profile), str(tmp_path / "nope.folded")])
    assert info.value.code == 2


def test_force_overwrites(tmp_path: Path, profile: Path) -> None:
    stacks = write(tmp_path / "s.folded", "GC Thread#0;x 1\n")
    out_csv = write(tmp_path / "x.csv", "task,samples,share\nold,1,1\n")  # a CSV this command wrote
    assert main(["match", "--profile", str(profile), str(stacks), "--csv", str(out_csv), "--force"]) == 0
    assert out_csv.read_text().startswith("task,samples,share\n") and "old" not in out_csv.read_text()


def test_force_never_replaces_a_file_it_did_not_write(tmp_path: Path, profile: Path) -> None:
    stacks = write(tmp_path / "s.folded", "GC Thread#0;x 1\n")
    notes = write(tmp_path / "notes.txt", "my own notes\n")
    for option in ("--csv", "--unmatched"):
        assert main(["match", "--profile", str(profile), str(stacks), option, str(notes), "--force"]) == 5
        assert notes.read_text() == "my own notes\n"
    assert main(["match", "--profile", str(profile), str(stacks), "--csv", str(tmp_path), "--force"]) == 5


def test_capture_directory_prints_stack_health_per_pid(
    tmp_path: Path, profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a capture whose pid 100 lost stacks at native frames and left interpreted frames unnamed
    from profiler.capture.format import SamplerStats, write_sampler_stats

    capture = tmp_path / "capture"
    write(capture / "pids" / "100" / "stacks.folded", "t;JacksonParser.p [i] 8\n")
    write(capture / "pids" / "200" / "stacks.folded", "t;JacksonParser.p 2\n")
    write_sampler_stats(
        capture,
        SamplerStats(
            pid=100,
            samples=200,
            interpreted_frames=1000,
            interpreted_named=990,
            interpreted_unnamed={"stale Method* (class unloaded or memory reused)": 10},
            stacks_cut={"ended at a native frame": 6, "depth limit (middle frames cut)": 2},
        ),
    )
    write_sampler_stats(capture, SamplerStats(pid=200, samples=50))  # nothing to say
    write(capture / "pids" / "300" / "stacks.folded", "t;Loop.drive [approx] 9\n")
    write_sampler_stats(capture, SamplerStats(pid=300, samples=10, compiled_samples=10, compiled_approximate=9,
                                              approximate_bytes=9 * 30))  # fmt: skip
    assert main(["match", "--profile", str(profile), str(capture)]) == 0
    printed = capsys.readouterr().out
    # THEN one health line for pid 100, causes by share, and none for the healthy pid 200
    assert "stack health" in printed
    assert (
        "pid 100: 4.0 % of samples cut (ended at a native frame 3.0 %, depth limit (middle frames cut) 1.0 %); "
        "1.0 % of 1000 interpreted frames unnamed (stale Method* (class unloaded or memory reused): 10)"
    ) in printed
    assert "pid 200" not in printed
    # AND a line for pid 300's compiled samples named from a borrowed scope
    assert "pid 300: 90 % of 10 compiled samples in code without exact debug information" in printed
