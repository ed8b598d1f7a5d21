"""The README is a user's guide that works (#33).

* Every ```python block runs, in order, in one namespace (the README reads
  top to bottom), in a fresh Python process: its quick start splits the CPU
  into 4 logical devices, which TensorFlow accepts only before it starts,
  so not in this process, where tests/conftest.py split it already.
* Every command of its ```sh blocks exists: `make` targets in the Makefile;
  `python -m MODULE` and console-script flags in the module's `--help`;
  `python path/to/script.py` scripts, and their flags among the absl or
  argparse flags the script and the repository modules it imports define;
  pip extras and requirements in pyproject.toml; pytest's flags in its
  `--help` and its `-m` markers in pytest.ini. ```json blocks parse.
* `make test`, the README's test command, is what .ci/run runs.
* Every relative link of README.md and CHANGELOG.md names a file of the
  repository, and its anchor a heading of that file; every repository path
  the README names in backticks exists.
* README.md has at most 300 lines.
"""

import ast
import functools
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

try:
  import tomllib  # Python 3.11+.
except ImportError:
  tomllib = None


def _root():
  for folder in pathlib.Path(__file__).resolve().parents:
    if (folder / "README.md").exists() and (folder / "Makefile").exists():
      return folder
  raise FileNotFoundError(f"no README.md and Makefile above {__file__}")


ROOT = _root()
README = ROOT / "README.md"
MAX_LINES = 300

#: Flags absl's `app.run` defines in every script.
ABSL_FLAGS = {"help", "helpfull", "helpshort", "helpxml", "flagfile",
              "undefok", "only_check_args", "pdb", "pdb_post_mortem",
              "run_with_pdb", "run_with_profiling", "profile_file",
              "use_cprofile_for_profiling", "logtostderr", "alsologtostderr",
              "log_dir", "verbosity", "v", "stderrthreshold",
              "showprefixforinfo", "logger_levels"}

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _blocks(language):
  """[(first line number, code)] of the README's ```language blocks."""
  text = README.read_text()
  return [(text.count("\n", 0, m.start(2)) + 1, m.group(2))
          for m in _FENCE.finditer(text) if m.group(1) == language]


def _env():
  env = dict(os.environ)
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  env.pop("TF_CONFIG", None)
  return env


def test_readme_has_at_most_300_lines():
  lines = len(README.read_text().splitlines())
  assert lines <= MAX_LINES, f"README.md has {lines} lines (at most {MAX_LINES})"


# -- Python blocks -------------------------------------------------------------

_RUNNER = """
import json, sys
namespace = {"__name__": "__main__"}
for line, code in json.load(open(sys.argv[1])):
  # Padded so that a traceback gives the README's own line numbers.
  exec(compile("\\n" * (line - 1) + code, "README.md", "exec"), namespace)
  print(f"README block at line {line}: ok", flush=True)
"""


def test_python_blocks_run_in_order(tmp_path):
  blocks = _blocks("python")
  assert len(blocks) >= 3, blocks
  (tmp_path / "blocks.json").write_text(json.dumps(blocks))
  (tmp_path / "runner.py").write_text(_RUNNER)
  out = subprocess.run(
      [sys.executable, str(tmp_path / "runner.py"),
       str(tmp_path / "blocks.json")],
      cwd=str(tmp_path), env=_env(), capture_output=True, text=True,
      timeout=900, check=False)
  log = out.stdout + out.stderr
  assert out.returncode == 0, log[-8000:]
  ran = re.findall(r"README block at line (\d+): ok", out.stdout)
  assert [int(line) for line in ran] == [line for line, _ in blocks], log[-8000:]


# -- Shell blocks --------------------------------------------------------------


@functools.cache
def _pyproject():
  if tomllib is None:
    pytest.skip("reading pyproject.toml needs Python 3.11's tomllib")
  with open(ROOT / "pyproject.toml", "rb") as f:
    return tomllib.load(f)


@functools.cache
def _make_targets():
  text = (ROOT / "Makefile").read_text()
  return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


def _help_flags(text):
  return {flag.lstrip("-") for flag in
          re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text)}


@functools.cache
def _module_flags(module):
  """The flags `python -m module --help` prints."""
  out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=str(ROOT),
                       env=_env(), capture_output=True, text=True, timeout=300,
                       check=False)
  assert out.returncode == 0, (module, out.stdout + out.stderr)
  return _help_flags(out.stdout)


@functools.cache
def _console_script_flags(name):
  """The flags `name --help` prints, `name` a [project.scripts] entry."""
  scripts = _pyproject()["project"]["scripts"]
  assert name in scripts, f"{name!r} is not a console script of pyproject.toml"
  module, function = scripts[name].split(":")
  code = (f"import sys; sys.argv = [{name!r}, '--help']; "
          f"from {module} import {function}; sys.exit({function}())")
  out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT),
                       env=_env(), capture_output=True, text=True, timeout=300,
                       check=False)
  assert out.returncode == 0, (name, out.stdout + out.stderr)
  return _help_flags(out.stdout)


def _local_module(name, folder):
  """The repository file of an imported module, outside the package."""
  parts = name.split(".")
  for base in (folder, ROOT):
    path = base.joinpath(*parts).with_suffix(".py")
    if path.exists() and "ndq_tf" not in path.relative_to(ROOT).parts:
      return path
  return None


@functools.cache
def _script_flags(script):
  """The absl or argparse flags a script and the modules it imports define."""
  flags = set(ABSL_FLAGS)
  todo, seen = [ROOT / script], set()
  while todo:
    path = todo.pop()
    if path in seen:
      continue
    seen.add(path)
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Call):
        function = node.func
        called = getattr(function, "attr", getattr(function, "id", ""))
        strings = [a.value for a in node.args if isinstance(a, ast.Constant)
                   and isinstance(a.value, str)]
        if called.startswith("DEFINE_") and strings:
          flags.add(strings[0])
          if called in ("DEFINE_bool", "DEFINE_boolean"):
            flags.add("no" + strings[0])
        elif called == "add_argument":
          flags.update(s.lstrip("-") for s in strings if s.startswith("-"))
      names = []
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names = [node.module] + [f"{node.module}.{alias.name}"
                                 for alias in node.names]
      for name in names:
        module = _local_module(name, path.parent)
        if module:
          todo.append(module)
  return flags


@functools.cache
def _pytest_help():
  out = subprocess.run([sys.executable, "-m", "pytest", "--help"],
                       cwd=str(ROOT), env=_env(), capture_output=True,
                       text=True, timeout=300, check=False)
  assert out.returncode == 0, out.stdout + out.stderr
  return _help_flags(out.stdout)


def _markers():
  text = (ROOT / "pytest.ini").read_text()
  return set(re.findall(r"^\s+(\w+):", text, re.M))


def _options(args):
  """The flag names of `args` (`--name`, `--name=value`, `-n`)."""
  return [arg.lstrip("-").split("=")[0] for arg in args
          if arg.startswith("-") and arg not in ("-", "--")]


def _check_flags(what, args, known):
  unknown = [flag for flag in _options(args) if flag not in known]
  assert not unknown, f"{what}: no such flag {unknown} (known: {sorted(known)})"


def _check_pip(args):
  assert args[:1] == ["install"], f"pip {args}: only `pip install` is checked"
  project = _pyproject()["project"]
  extras = set(project["optional-dependencies"])
  deps = {re.match(r"[\w.-]+", dep).group(0).lower()
          for dep in project["dependencies"]}
  for arg in args[1:]:
    if arg.startswith("-"):
      continue
    match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", arg)
    if match:
      missing = set((match.group(1) or "").split(",")) - extras - {""}
      assert not missing, f"pip install {arg}: no extra {missing} ({extras})"
    else:
      name = re.match(r"[\w.-]+", arg).group(0).lower()
      assert name in deps, f"pip install {arg}: {name} is not a dependency"


def _check_python(args):
  if args[:1] == ["-m"]:
    module, rest = args[1], args[2:]
    if module == "pytest":
      _check_flags("pytest", rest, _pytest_help())
      for i, arg in enumerate(rest):
        if arg == "-m":
          words = set(re.findall(r"\w+", rest[i + 1])) - {"and", "or", "not"}
          assert words <= _markers(), f"pytest -m {rest[i + 1]}: no marker"
        elif not arg.startswith("-") and (i == 0 or
                                          not rest[i - 1].startswith("-")):
          assert (ROOT / arg).exists(), f"pytest {arg}: no such path"
      return
    if module == "pip":
      _check_pip(rest)
      return
    own, command = _split_command(rest)
    _check_flags(f"python -m {module}", own, _module_flags(module))
    if command:
      _check_command(command)
    return
  script, rest = args[0], args[1:]
  assert (ROOT / script).is_file(), f"python {script}: no such file"
  _check_flags(f"python {script}", rest, _script_flags(script))


def _split_command(args):
  """A launcher's own arguments, and the command after its `--`."""
  if "--" in args:
    i = args.index("--")
    return args[:i], args[i + 1:]
  return args, []


def _check_command(words):
  while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
    words = words[1:]  # Environment assignments.
  if words[:1] == ["sudo"]:
    words = words[1:]
  program, args = words[0], words[1:]
  if program == "make":
    targets = [arg for arg in args if not arg.startswith("-") and "=" not in arg]
    missing = set(targets) - _make_targets()
    assert not missing, f"make {missing}: no such target in the Makefile"
  elif program == "pip":
    _check_pip(args)
  elif re.fullmatch(r"(\S*/)?python3?", program):
    _check_python(args)
  elif program in _pyproject()["project"].get("scripts", {}):
    own, command = _split_command(args)
    _check_flags(program, own, _console_script_flags(program))
    if command:
      _check_command(command)
  else:
    raise AssertionError(
        f"{' '.join(words)}: the README test knows no command {program!r}; "
        "teach tests/test_readme.py to check it")


def _shell_commands():
  for line, code in _blocks("sh"):
    for logical in code.replace("\\\n", " ").splitlines():
      words = shlex.split(logical, comments=True)
      command = []
      for word in words + [";"]:
        if word in (";", "&&", "||", "|"):
          if command:
            yield line, command
          command = []
        else:
          command.append(word)


def test_shell_blocks_name_commands_and_flags_that_exist():
  commands = list(_shell_commands())
  assert len(commands) >= 5, commands
  for line, words in commands:
    try:
      _check_command(words)
    except AssertionError as e:
      raise AssertionError(f"README.md, block at line {line}: {e}") from None


def test_make_test_is_the_readme_test_command_and_ci_runs_it():
  commands = [words for _, words in _shell_commands()]
  assert ["make", "test"] in commands and ["make", "demo"] in commands
  ci = (ROOT / ".ci" / "run").read_text()
  assert re.search(r"^make test$", ci, re.M), ".ci/run no longer runs make test"


def test_json_blocks_parse():
  for line, code in _blocks("json"):
    try:
      json.loads(code)
    except json.JSONDecodeError as e:
      raise AssertionError(f"README.md, block at line {line}: {e}") from None


# -- Links and paths -----------------------------------------------------------


def _slug(heading):
  """GitHub's anchor of a markdown heading."""
  text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path):
  text = _FENCE.sub("", path.read_text())
  return {_slug(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M)}


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_relative_links_resolve(name):
  source = ROOT / name
  broken = []
  for target in _LINK.findall(_FENCE.sub("", source.read_text())):
    if re.match(r"[a-z]+:", target):
      continue  # http(s), mailto.
    path, _, anchor = target.partition("#")
    file = (source.parent / path).resolve() if path else source
    relative = file.relative_to(ROOT).as_posix() if file.is_relative_to(
        ROOT) else str(file)
    if not file.exists():
      broken.append(f"{target}: no such file")
    elif anchor and anchor not in _anchors(file):
      broken.append(f"{target}: no heading #{anchor} in {relative}")
  assert not broken, f"{name}: " + "; ".join(broken)


def test_paths_named_in_the_readme_exist():
  text = README.read_text()
  paths = set(re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|toml|ini))`", text))
  missing = sorted(p for p in paths if not (ROOT / p).exists())
  assert not missing, f"README.md names missing files: {missing}"
