"""known_spes.txt parsing, entry-point extraction and the classification table."""

from __future__ import annotations

import argparse
import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from profiler.errors import ConfigError
from profiler.scope.spes import (
    DEFAULT_ROLES,
    ROLES,
    _literal_runs,
    classify,
    classify_parent,
    default_known_spes_path,
    default_spark_master,
    engine_executable,
    entry_point,
    interpreted_entries_only,
    literal_glob,
    load_known_spes,
    parse_known_spes,
    parse_spark_defaults_master,
    required_fragments,
    role_list,
    summarize_cmdline,
)

REPO = Path(__file__).resolve().parents[3]
KINDS = load_known_spes(REPO / "known_spes.txt")
JAVA = ["/usr/lib/jvm/java-17-openjdk-amd64/bin/java", "-cp", "/opt/spark/conf/:/opt/spark/jars/*", "-Xmx1g"]


def kind_of(cmdline: list[str], default_master: str | None = None) -> tuple[str, str, str] | None:
    found = classify(cmdline, KINDS, default_master)
    return None if found is None else (found.engine, found.role, found.kind)


def test_default_path_is_the_top_level_file_in_a_source_tree() -> None:
    assert default_known_spes_path() == REPO / "known_spes.txt"


def test_parse_fields_conditions_and_comments() -> None:
    text = (
        "# header\n"
        "\n"
        "spark workload executor org.example.Exec   # trailing comment\n"
        "spark managing driver org.example.Submit class=org.Foo master=local|local[[]*\n"
        "spark managing py parent-of:org.example.Submit arg=pyspark-shell\n"
    )
    kinds = parse_known_spes(text, "k.txt")
    assert [(k.engine, k.role, k.kind, k.pattern, k.line) for k in kinds] == [
        ("spark", "workload", "executor", "org.example.Exec", 3),
        ("spark", "managing", "driver", "org.example.Submit", 4),
        ("spark", "managing", "py", "org.example.Submit", 5),
    ]
    assert kinds[1].conditions == (("class", "org.Foo"), ("master", "local|local[[]*"))
    assert kinds[2].parent_of and not kinds[1].parent_of


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("spark workload executor\n", "k.txt:1: expected 'ENGINE ROLE KIND PATTERN"),
        ("# c\nspark worker executor org.X\n", "k.txt:2: unknown role 'worker'; use one of workload, managing, broker"),
        ("spark workload executor org.X color=red\n", "k.txt:1: bad condition 'color=red'"),
        ("spark workload executor org.X master\n", "k.txt:1: bad condition 'master'"),
        ("spark workload exec/utor org.X\n", "k.txt:1: kind 'exec/utor'"),
        ("spark workload executor master=local\n", "k.txt:1: pattern 'master=local'"),
        ("# only comments\n", "k.txt: no process kinds defined"),
    ],
)
def test_parse_errors_name_file_line_and_fix(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_known_spes(text, "k.txt")
    assert str(info.value).startswith(message)
    assert "; " in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_known_spes(tmp_path / "nope.txt")


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (
            JAVA + ["org.apache.spark.executor.CoarseGrainedExecutorBackend", "--driver-url", "spark://x"],
            ("spark", "workload", "executor"),
        ),
        (
            JAVA + ["org.apache.spark.executor.YarnCoarseGrainedExecutorBackend", "--executor-id", "1"],
            ("spark", "workload", "executor"),
        ),
        (
            JAVA + ["org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"],
            ("spark", "workload", "executor"),
        ),
        (["python3", "-m", "pyspark.daemon"], ("spark", "workload", "python-worker")),
        (["/usr/bin/python3.11", "-u", "-m", "pyspark.worker"], ("spark", "workload", "python-worker")),
        (["python3", "-mpyspark.daemon"], ("spark", "workload", "python-worker")),
        (
            JAVA + ["org.apache.spark.deploy.SparkSubmit", "--master", "spark://h:7077", "app.py"],
            ("spark", "managing", "driver"),
        ),
        (
            JAVA + ["org.apache.spark.deploy.SparkSubmit", "--master=yarn", "--class", "a.B", "app.jar"],
            ("spark", "managing", "driver"),
        ),
        (
            JAVA + ["org.apache.spark.deploy.SparkSubmit", "--master", "local[2]", "app.py"],
            ("spark", "workload", "local-driver"),
        ),
        (
            JAVA + ["org.apache.spark.deploy.SparkSubmit", "--master", "local", "app.py"],
            ("spark", "workload", "local-driver"),
        ),
        (
            JAVA + ["org.apache.spark.deploy.SparkSubmit", "--conf", "spark.master=local[*]", "pyspark-shell"],
            ("spark", "workload", "local-driver"),
        ),
        (
            JAVA + ["org.apache.spark.deploy.SparkSubmit", "--conf", "spark.master=spark://h:7077", "pyspark-shell"],
            ("spark", "managing", "driver"),
        ),
        # --master wins over --conf spark.master, as in SparkSubmitArguments
        (
            JAVA + ["org.apache.spark.deploy.SparkSubmit", "--conf", "spark.master=local", "--master", "yarn", "x"],
            ("spark", "managing", "driver"),
        ),
        # local-cluster runs separate executor processes: the driver stays managing
        (
            JAVA + ["org.apache.spark.deploy.SparkSubmit", "--master", "local-cluster[2,1,1024]", "x.py"],
            ("spark", "managing", "driver"),
        ),
        # nothing names a master: SparkSubmit defaults to local[*]
        (
            JAVA + ["org.apache.spark.deploy.SparkSubmit", "--class", "a.B", "app.jar"],
            ("spark", "workload", "local-driver"),
        ),
        (
            JAVA
            + [
                "org.apache.spark.deploy.SparkSubmit",
                "--master",
                "spark://h:7077",
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "spark-internal",
            ],
            ("spark", "managing", "connect-server"),
        ),
        (
            JAVA
            + [
                "org.apache.spark.deploy.SparkSubmit",
                "--master",
                "local[4]",
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "spark-internal",
            ],
            ("spark", "workload", "local-connect-server"),
        ),
        (
            JAVA
            + [
                "org.apache.spark.deploy.SparkSubmit",
                "--master",
                "yarn",
                "--class",
                "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2",
                "spark-internal",
            ],
            ("spark", "managing", "thrift-server"),
        ),
        (
            JAVA + ["org.apache.spark.deploy.master.Master", "--host", "h", "--port", "7077"],
            ("spark", "managing", "master"),
        ),
        (JAVA + ["org.apache.spark.deploy.worker.Worker", "spark://h:7077"], ("spark", "managing", "worker")),
        (JAVA + ["org.apache.spark.deploy.history.HistoryServer"], ("spark", "managing", "history-server")),
        (
            JAVA + ["org.apache.spark.deploy.worker.DriverWrapper", "spark://Worker@h:1"],
            ("spark", "managing", "driver"),
        ),
        (
            JAVA + ["org.apache.spark.deploy.yarn.ApplicationMaster", "--class", "A"],
            ("spark", "managing", "application-master"),
        ),
        (
            JAVA + ["org.apache.flink.runtime.taskexecutor.TaskManagerRunner", "--configDir", "/c"],
            ("flink", "workload", "taskmanager"),
        ),
        (JAVA + ["org.apache.flink.yarn.YarnTaskExecutorRunner"], ("flink", "workload", "taskmanager")),
        (
            JAVA + ["org.apache.flink.kubernetes.taskmanager.KubernetesTaskExecutorRunner"],
            ("flink", "workload", "taskmanager"),
        ),
        (
            JAVA + ["org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint", "--configDir", "/c"],
            ("flink", "managing", "jobmanager"),
        ),
        (
            JAVA + ["org.apache.flink.container.entrypoint.StandaloneApplicationClusterEntryPoint"],
            ("flink", "managing", "jobmanager"),
        ),
        (JAVA + ["org.apache.flink.yarn.entrypoint.YarnSessionClusterEntrypoint"], ("flink", "managing", "jobmanager")),
        (JAVA + ["org.apache.flink.yarn.entrypoint.YarnJobClusterEntrypoint"], ("flink", "managing", "jobmanager")),
        (
            JAVA + ["org.apache.flink.yarn.entrypoint.YarnApplicationClusterEntryPoint"],
            ("flink", "managing", "jobmanager"),
        ),
        (
            JAVA + ["org.apache.flink.kubernetes.entrypoint.KubernetesSessionClusterEntrypoint"],
            ("flink", "managing", "jobmanager"),
        ),
        (
            JAVA + ["org.apache.flink.kubernetes.entrypoint.KubernetesApplicationClusterEntrypoint"],
            ("flink", "managing", "jobmanager"),
        ),
        (["python", "-m", "pyflink.fn_execution.beam.beam_boot", "--id=1"], ("flink", "workload", "python-worker")),
        (JAVA + ["org.apache.storm.daemon.worker.Worker", "topo-1", "sup", "6700"], ("storm", "workload", "worker")),
        (JAVA + ["org.apache.storm.daemon.nimbus.Nimbus"], ("storm", "managing", "nimbus")),
        (JAVA + ["com.hazelcast.core.server.HazelcastMemberStarter"], ("hazelcast", "workload", "member")),
    ],
)
def test_classification_table(cmdline: list[str], expected: tuple[str, str, str]) -> None:
    assert kind_of(cmdline) == expected


@pytest.mark.parametrize(
    "cmdline",
    [
        [],
        ["grep", "org.apache.spark.executor.CoarseGrainedExecutorBackend"],
        ["tail", "-f", "/var/log/org.apache.spark.deploy.master.Master.out"],
        # spark-class's launcher carries the class to run as an argument; it is not that process
        JAVA + ["org.apache.spark.launcher.Main", "org.apache.spark.deploy.SparkSubmit", "--master", "local"],
        ["bash", "-c", "java -cp x org.apache.spark.executor.YarnCoarseGrainedExecutorBackend 1>out"],
        JAVA + ["com.example.MyApp", "org.apache.spark.executor.CoarseGrainedExecutorBackend"],
        ["python3", "my_pyspark_app.py", "pyspark.daemon"],
        ["python3", "-c", "import pyspark.daemon"],
        JAVA + ["org.apache.spark.executor.CoarseGrainedExecutorBackendX"],
        ["/usr/sbin/sshd", "-D"],
    ],
)
def test_non_matches(cmdline: list[str]) -> None:
    assert kind_of(cmdline) is None


def test_simple_class_name_pattern_and_jar_and_module() -> None:
    kinds = parse_known_spes(
        "eng workload a TaskManagerRunner\neng workload b my-engine.jar\neng managing c org.x.Main\n", "k"
    )
    assert classify(JAVA + ["org.apache.flink.runtime.taskexecutor.TaskManagerRunner"], kinds).kind == "a"  # type: ignore[union-attr]
    assert classify(["java", "-Xmx1g", "-jar", "/opt/my-engine.jar", "--x"], kinds).kind == "b"  # type: ignore[union-attr]
    assert classify(["java", "--module", "eng.mod/org.x.Main"], kinds).kind == "c"  # type: ignore[union-attr]
    assert classify(["java", "-p", "mods", "-m", "eng.mod/org.x.Main"], kinds).kind == "c"  # type: ignore[union-attr]


def test_default_master_from_environment_and_defaults_file() -> None:
    submit = JAVA + ["org.apache.spark.deploy.SparkSubmit", "--class", "a.B", "app.jar"]
    files = {
        "/opt/spark/conf/spark-defaults.conf": "# c\nspark.master   spark://m:7077\n",
        "/p.conf": "spark.master=local[3]",
    }
    assert default_spark_master(submit, {"SPARK_HOME": "/opt/spark"}, files.get) == "spark://m:7077"
    assert default_spark_master(submit, {"MASTER": "yarn", "SPARK_HOME": "/opt/spark"}, files.get) == "yarn"
    assert default_spark_master(submit + ["--properties-file", "/p.conf"], {}, files.get) == "local[3]"
    assert default_spark_master(submit, {}, files.get) is None
    assert kind_of(submit, "spark://m:7077") == ("spark", "managing", "driver")
    assert kind_of(submit, None) == ("spark", "workload", "local-driver")
    assert parse_spark_defaults_master("spark.master: yarn\nspark.masterx local\n") == "yarn"


def test_pyspark_driver_is_the_parent_of_its_spark_submit() -> None:
    submit = JAVA + ["org.apache.spark.deploy.SparkSubmit", "--conf", "spark.master=local[1]", "pyspark-shell"]
    parent = classify_parent(submit, KINDS)
    assert parent is not None and (parent.engine, parent.role, parent.kind) == ("spark", "managing", "pyspark-driver")
    assert classify_parent(JAVA + ["org.apache.spark.deploy.SparkSubmit", "app.jar"], KINDS) is None
    # parent-of lines never classify the process itself
    assert kind_of(submit) == ("spark", "workload", "local-driver")


def test_most_conditions_win_then_file_order() -> None:
    kinds = parse_known_spes("e managing plain M\ne workload cond M arg=x\ne managing later M arg=x\n", "k")
    assert classify(["java", "M", "x"], kinds).kind == "cond"  # type: ignore[union-attr]
    assert classify(["java", "M", "y"], kinds).kind == "plain"  # type: ignore[union-attr]


def test_python_entry_points() -> None:
    assert entry_point(["python3", "-u", "-W", "ignore", "-m", "pkg.mod", "a"]).names[-1] == "pkg.mod"
    assert entry_point(["python3", "-um", "pkg.mod"]).args == ()
    assert entry_point(["python3", "-B", "/srv/job.py", "--x"]).names[-2:] == ("/srv/job.py", "job.py")


def test_summary_keeps_main_class_and_caps_length() -> None:
    long_jvm = ["/usr/bin/java", "-cp", "a" * 5000, "-Xmx1g", "-XX:+PreserveFramePointer"]
    long_jvm += [f"--add-opens=java.base/p{i}=ALL-UNNAMED" for i in range(30)]
    summary = summarize_cmdline([*long_jvm, "org.apache.spark.deploy.SparkSubmit", "--master", "spark://h:1", "a.py"])
    assert summary == (
        "java -Xmx1g -XX:+PreserveFramePointer [32 more JVM options] org.apache.spark.deploy.SparkSubmit"
        " --master spark://h:1 a.py"
    )
    assert summarize_cmdline(["java", "-Xmx1g", "-jar", "/opt/x.jar", "--a"]) == "java -Xmx1g -jar /opt/x.jar --a"
    assert len(summarize_cmdline(["java", "Main", *["x" * 100] * 20], limit=300)) <= 300
    assert summarize_cmdline(["tool", "-cp", "b" * 500, "x"]) == "tool -cp <500 chars> x"
    assert summarize_cmdline(["python3", "-m", "pyspark.daemon"]) == "python3 -m pyspark.daemon"
    assert summarize_cmdline([]) == ""


@pytest.mark.parametrize(
    ("glob", "runs"),
    [
        ("org.apache.X", ["org.apache.X"]),
        ("a*b?cd", ["a", "b", "cd"]),
        ("local[[]*", ["local"]),
        ("x[!]]yz", ["x", "yz"]),
        ("ab[cd", ["ab"]),  # an unclosed [ is literal in fnmatch; what follows it is left out
        ("[]]", []),
        ("*", []),
    ],
)
def test_literal_runs_of_a_glob(glob: str, runs: list[str]) -> None:
    assert _literal_runs(glob) == runs


def test_required_fragments_are_in_every_matching_command_line() -> None:
    kinds = parse_known_spes(
        "e workload a org.apache.*Backend\ne workload b pyspark.d?emon|x[!]]yz master=local*\n", "test"
    )
    fragments = required_fragments(kinds)
    assert fragments == ("org.apache.", "pyspark.d", "yz")
    for glob, text in [("org.apache.*Backend", "org.apache.ExecBackend"), ("x[!]]yz", "xayz")]:
        assert fnmatchcase(text, glob) and any(f in text for f in fragments)
    assert required_fragments(parse_known_spes("e workload a run|*\n", "test")) is None


def test_broker_is_a_role_and_the_shipped_file_knows_kafka_brokers() -> None:
    # GIVEN the shipped known_spes.txt; WHEN a Kafka broker's command line (kafka-server-start.sh) is classified
    kinds = load_known_spes(default_known_spes_path())
    broker = ("java", "-Xmx1G", "-cp", "/opt/kafka/libs/*", "kafka.Kafka", "/opt/kafka/config/server.properties")
    kind = classify(broker, kinds)
    # THEN it is the broker role of engine kafka, counted but not sampled; its tools are no broker
    assert kind is not None and (kind.engine, kind.role, kind.kind) == ("kafka", "broker", "broker")
    assert not kind.sampled
    tool = ("java", "-cp", "/opt/kafka/libs/*", "kafka.tools.StorageTool", "format", "-c", "server.properties")
    assert classify(tool, kinds) is None


@pytest.mark.parametrize(
    ("text", "roles"),
    [
        ("workload", ("workload",)),
        ("workload,managing,broker", ("workload", "managing", "broker")),
        ("broker, workload,broker", ("broker", "workload")),
    ],
)
def test_role_list_keeps_order_without_repeats(text: str, roles: tuple[str, ...]) -> None:
    assert role_list(text) == roles


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workers", "'workers': unknown role 'workers'; use one of workload, managing, broker"),
        ("workload,,broker", "expected ROLE[,ROLE...]"),
        ("", "expected ROLE[,ROLE...]"),
        ("Broker", "unknown role 'Broker'"),
    ],
)
def test_role_list_names_the_bad_word(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        role_list(text)


def test_default_roles_leave_brokers_out() -> None:
    assert DEFAULT_ROLES == ("workload", "managing") and set(DEFAULT_ROLES) < set(ROLES)


@pytest.mark.parametrize(
    "text",
    ["/tmp/kafka-local-ab12/server.properties", "/tmp/a[1]*?/x.properties", "/tmp/my dir|#x/s.properties"],
)
def test_literal_glob_matches_its_text_and_fits_a_line(text: str) -> None:
    glob = literal_glob(text)
    assert fnmatchcase(text, glob)
    assert not any(char.isspace() or char in "|#" for char in glob)
    assert not fnmatchcase(text + "x", glob) and not fnmatchcase("/tmp/other/server.properties", glob)
    # a line carrying it parses, and selects the process started with that file
    (kind,) = parse_known_spes(f"kafka broker broker kafka.Kafka arg={glob}\n", "k.txt")
    assert classify(("java", "kafka.Kafka", text), (kind,)) == kind
    assert classify(("java", "kafka.Kafka", "/tmp/other/server.properties"), (kind,)) is None


def test_engine_executables_and_when_the_scope_may_judge_by_them() -> None:
    assert all(engine_executable(n) for n in ("java", "python3", "python3.11", "pypy3", "java (deleted)"))
    assert not any(engine_executable(n) for n in ("bash", "sleep", "true", "javac", "jsvc", "pythonista"))
    assert interpreted_entries_only(KINDS)  # the shipped file
    for pattern in ("my-engine-daemon", "/opt/bin/engine.bin", "kafka-server-start.sh", "*", "a.B|daemon"):
        assert not interpreted_entries_only(parse_known_spes(f"x workload y {pattern}\n", "t")), pattern
