"""Task-level CPU profiler for distributed stream processing systems."""

from __future__ import annotations

import re
from glob import glob
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent


class BuildWithKnownSpes(build_py):
    """known_spes.txt has one copy in the tree, at its top (the file the README tells users to edit); the
    package carries it in profiler/scope/ so an installed host agent finds it without the tree
    (profiler.scope.spes.default_known_spes_path; coordinator/remote/deploy.py adds it to its bundle the same way)."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "profiler" / "scope" / "known_spes.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(HERE / "known_spes.txt"), str(target))

VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "profiler" / "__init__.py").read_text()).group(1)

setup(
    name="spe-taskprof",
    version=VERSION,
    description="Task-level CPU profiler for Spark and Flink stream processing clusters (eBPF + PMC)",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=[
        "profiler",
        "profiler.commands",
        "profiler.bpf",
        "profiler.capture",
        "profiler.engines",
        "profiler.files",
        "profiler.matching",
        "profiler.run",
        "profiler.sampling",
        "profiler.scope",
        "profiler.symbols",
        "profiler.unwind",
        "coordinator",
        "coordinator.commands",
        "coordinator.remote",
        "coordinator.analysis",
        "coordinator.report",
        "coordinator.export",
        "coordinator.workloads",
        "coordinator.workloads.ysb",
        "coordinator.templates",
        "coordinator.application_profiles",
    ],
    # templates/ and application_profiles/ live at the top of the tree but ship inside the package,
    # so an installed wheel renders reports and finds the default profiles without the source tree.
    package_dir={
        "coordinator.templates": "templates",
        "coordinator.application_profiles": "application_profiles",
    },
    package_data={
        # The BPF C beside the Python that loads it; agent/Makefile: perfmap.py builds the perf-map agent
        # from it on the host.
        "profiler.sampling": ["*.c", "*.h"],
        "profiler.scope": ["*.c"],  # and known_spes.txt, copied from the top by BuildWithKnownSpes
        "profiler.unwind": ["*.h"],
        "profiler.symbols": ["agent/*.c", "agent/Makefile"],
        "coordinator.templates": ["*.html", "*.css", "*.js", "vendor/*"],
        "coordinator.application_profiles": ["*.txt"],
        "coordinator.workloads.ysb": ["*.java"],
        # pprof's profile.proto (Apache-2.0) beside the classes protoc generated from it
        "coordinator.export": ["profile.proto", "profile.proto.LICENSE", "profile_pb2.pyi"],
    },
    data_files=[("share/spe-taskprof", ["known_spes.txt", "cluster.txt"] + sorted(glob("application_profiles/*.txt")))],
    install_requires=["psutil>=5.9"],
    extras_require={
        "coordinator": [
            "paramiko>=3", "jinja2>=3", "pyspark==4.2.0", "pandas>=2", "pyarrow>=14", "rich>=13",
            "numpy>=1.24",  # coordinator/analysis/decide.py sums stack-table rows with it (pandas brings it too)
            # coordinator/export/profile_pb2.py was generated for protobuf 7.35.1 (scripts/gen-pprof-proto.sh)
            "protobuf>=7.35.1,<8",
        ],
        "dev": [
            "pytest>=8", "pytest-timeout", "ruff", "mypy", "build", "wheel", "jsonschema>=4", "hypothesis>=6",
            # the layers contract of both packages ([tool.importlinter] in pyproject.toml, `make lint`)
            "import-linter>=2",
        ],
    },
    cmdclass={"build_py": BuildWithKnownSpes},
    entry_points={
        "console_scripts": [
            "profiler=profiler.cli:main",
            "coordinator=coordinator.cli:main",
        ]
    },
)
