"""A `py_test` that runs its test file under pytest."""

load("@rules_python//python:defs.bzl", "py_test")

def pytest_test(name, srcs, deps = [], args = [], data = [], **kwargs):
    """Runs `srcs` under pytest, with the repository's pytest.ini and conftest.py.

    Args:
      name: target name, by convention the test file's name without `.py`.
      srcs: the test file(s) to run.
      deps: `py_library` targets the tests import.
      args: extra pytest arguments.
      data: extra runtime files (scripts the test starts, ...).
      **kwargs: passed on to `py_test` (size, timeout, tags, ...).
    """
    py_test(
        name = name,
        srcs = srcs + ["//tools:pytest_main.py"],
        main = "//tools:pytest_main.py",
        args = ["$(rootpath %s)" % src for src in srcs] + args,
        data = data + ["//:pytest.ini"],
        deps = deps + ["//tests:conftest"],
        **kwargs
    )
