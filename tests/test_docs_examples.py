"""Examples that cannot go stale: every ```python and ```bash block in README.md and docs/*.md runs
here, unless the line right before its fence is `<!-- skip: <reason> -->` (a GPU, several
processes, long training, an install); a marker without a reason fails. And every config key, CLI
flag and `specdec.` name the pages mention must still exist.

How a block runs: placeholders are replaced by tiny models built here (a 2-layer Llama target and a
1-layer draft, one character-level tokenizer; untrained Medusa heads and an EAGLE drafter for the
target): `/path/to/target`, `/path/to/draft`, `/path/to/heads`, `/path/to/eagle` (EAGLE-1), `/path/to/eagle3`; and
`/path/to/out` by a fresh folder. Python blocks of one page run in order in one namespace (a later
block may use an earlier one's `sd`); `specdec` is imported. A bash block's lines (backslash
continuations joined, `# comments` dropped) must each be a `specdec ...` or `python -m specdec ...`
command, run in-process through `specdec.cli.main`, and must exit 0. Two exceptions make a server
page runnable: `specdec serve ...` starts that server in a process of its own (port 8000 on the page
becomes a free port, in every block after it too), which the page's later blocks talk to, and which
must stop with status 0 on SIGTERM at the end of the page; and a `curl ...` line runs as a process
against it, must exit 0 and must print no error.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import os
import re
import json
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

from conftest import char_tokenizer, tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(REPO, "docs"))
                               if n.endswith(".md"))
FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"^<!--\s*skip:(.*?)-->\s*$")


def blocks(page: str) -> list[dict]:
    """[{lang, code, line, skip}] of one page's fenced blocks."""
    lines = open(os.path.join(REPO, page)).read().splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match and match.group(1):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = lines[i - 1] if i else ""
            skip = SKIP.match(before)
            found.append(dict(lang=match.group(1), code="\n".join(lines[i + 1:end]), line=i + 1,
                              skip=None if skip is None else skip.group(1).strip()))
            i = end + 1
        else:
            i += 1
    return found


def runnable(page: str) -> list[dict]:
    return [b for b in blocks(page) if b["lang"] in ("python", "bash") and b["skip"] is None]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs_models")
    target = tiny_model("llama", seed=1, sharpen=4.0)
    for name, model in (("target", target), ("draft", tiny_model("llama", seed=2, layers=1))):
        model.save_pretrained(root / name)
        tokenizer = char_tokenizer()
        if name == "target":          # the server page's chat example
            from serve_helpers import CHAT_TEMPLATE
            tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(root / name)
    from specdec.heads import EagleDrafter, HeadsLayout, MedusaHeads, save_eagle, save_heads
    from specdec.heads.eagle import layout_for_target
    from specdec.heads.io import output_vocab
    save_heads(str(root / "heads"), MedusaHeads(HeadsLayout(3, 1, target.config.hidden_size, output_vocab(target))),
               target)
    save_eagle(str(root / "eagle"), EagleDrafter(layout_for_target(target)), target)
    from specdec.heads.eagle3 import Eagle3Drafter, eagle3_layout_for_target
    drafter = Eagle3Drafter(eagle3_layout_for_target(target, (0, 1, 2), draft_vocab_size=48))
    drafter.set_draft_vocab(torch.arange(0, 96, 2))
    save_eagle(str(root / "eagle3"), drafter, target)
    return root


def substitute(code: str, models, out) -> str:
    for name in ("target", "draft", "heads", "eagle3", "eagle"):
        code = code.replace(f"/path/to/{name}", str(models / name))
    return code.replace("/path/to/out", str(out))


def shell_commands(code: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        commands.append(line.split(" # ")[0].strip() if " # " in line else line)
    return commands


@pytest.mark.parametrize("page", PAGES)
def test_skip_markers_give_a_reason(page):
    for block in blocks(page):
        assert block["skip"] is None or block["skip"], f"{page}:{block['line']}: a skip marker needs a reason"


SERVER_PORT = "8000"          # the port a server page's examples use


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def start_server(words: list[str], port: str, where: str, env: dict) -> subprocess.Popen:
    """`specdec serve ...` from a page, in a process of its own, once its /health answers 200."""
    process = subprocess.Popen([sys.executable, "-m", "specdec", *words[1:], "--log-level", "warning"], cwd=REPO,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"{where}: the server did not come up: {process.communicate()[1][-800:]}")


def run_curl(words: list[str], command: str, where: str) -> None:
    result = subprocess.run(words, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{where}: `{command}` exited {result.returncode}: {result.stderr[-800:]}"
    events = [line[6:] for line in result.stdout.splitlines() if line.startswith("data: ")] or [result.stdout]
    for event in events:
        if event.strip() != "[DONE]":
            answer = json.loads(event)
            assert "error" not in answer, f"{where}: `{command}` answered {answer}"


@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)])
def test_page_examples_run(page, models, tmp_path, monkeypatch):
    from specdec.cli import main as cli_main
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    namespace = {"specdec": importlib.import_module("specdec")}
    port = free_port()
    servers: list[subprocess.Popen] = []
    try:
        for n, block in enumerate(runnable(page)):
            code = substitute(block["code"], models, tmp_path / "out")
            if servers:
                code = code.replace(f"127.0.0.1:{SERVER_PORT}", f"127.0.0.1:{port}")
            where = f"{page}:{block['line']}"
            if block["lang"] == "python":
                with redirect_stdout(io.StringIO()):
                    exec(compile(code, where, "exec"), namespace)       # noqa: S102 - the docs' own examples
                continue
            for command in shell_commands(code):
                words = shlex.split(command)
                if words[:3] == ["python", "-m", "specdec"]:
                    words = ["specdec"] + words[3:]
                if words[0] == "curl" and servers:
                    run_curl(words, command, where)
                    continue
                assert words[0] == "specdec", (f"{where}: `{command}` is not a specdec command: run it here or mark "
                                               f"the block <!-- skip: reason -->")
                if words[1] == "serve":
                    words = [port if i and words[i - 1] == "--port" else w for i, w in enumerate(words)]
                    servers.append(start_server(words, port, where, dict(os.environ)))
                    continue
                with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
                    code_ = cli_main(words[1:])
                assert code_ == 0, f"{where}: `{command}` exited {code_}: {err.getvalue()[-800:]}"
    finally:
        for server in servers:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            finally:
                if server.poll() is None:
                    server.kill()
    for server in servers:
        assert server.returncode == 0, f"{page}: the server exited {server.returncode}: {server.communicate()[1][-800:]}"


# ---------------------------------------------------------------------- names that must still exist
def all_text() -> str:
    return "\n".join(open(os.path.join(REPO, p)).read() for p in PAGES)


def config_keys() -> set[str]:
    from specdec.config import spec_config_class
    keys = set()
    for f in dataclasses.fields(spec_config_class()):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            keys |= {f"{f.name}.{g.name}" for g in dataclasses.fields(f.default_factory)}
        keys.add(f.name)
    return keys


def test_documented_config_keys_exist():
    from specdec.config import spec_config_class
    sections = {f.name for f in dataclasses.fields(spec_config_class())
                if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)}
    keys = config_keys()
    text = all_text()
    mentioned = set(re.findall(r"(?<![\w./-])([a-z_]+\.[a-z_]+)(?:=|\"\s*:)", text))
    checked = {k for k in mentioned if k.split(".")[0] in sections}
    assert checked, "no config key found in the docs: the pattern broke"
    missing = sorted(checked - keys)
    assert not missing, f"documented config keys that do not exist: {missing}"


def _help_texts() -> str:
    """The --help of every subcommand and of the demo (`make demo ARGS="--models ..."`)."""
    from specdec.cli import main as cli_main
    from specdec.family.demo import main as demo_main
    runs = [(cli_main, command + ["--help"]) for command in
            ([], ["generate"], ["serve"], ["check"], ["profile"], ["bench"], ["export"], ["train-heads"])]
    runs.append((demo_main, ["--help"]))
    texts = []
    for run, argv in runs:
        buffer = io.StringIO()
        with redirect_stdout(buffer), redirect_stderr(io.StringIO()):
            try:
                run(argv)
            except SystemExit:
                pass
        texts.append(buffer.getvalue())
    for script in ("scripts/gpu/check.sh", "scripts/gpu/pack.sh"):     # the GPU check's own flags
        texts.append(subprocess.run(["bash", os.path.join(REPO, script), "--help"], capture_output=True, text=True).stdout)
    return "\n".join(texts)


def flag_text() -> str:
    """The pages without the skipped blocks of other programs (vLLM's, torchrun's, pip's flags)."""
    text = all_text()
    for page in PAGES:
        for block in blocks(page):
            if block["skip"] and "specdec" not in block["code"]:
                text = text.replace(block["code"], "")
    return text


def test_documented_cli_flags_exist():
    text = flag_text()
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)(?!\w)", text))
    flags -= {"--no-build-isolation", "--no-deps"}     # pip's
    help_text = _help_texts()
    assert "--prompts-file" in help_text, "the CLI help could not be read"
    missing = sorted(f for f in flags if f not in help_text)
    assert not missing, f"documented CLI flags no command has: {missing}"


def test_documented_specdec_names_exist():
    names = set(re.findall(r"`(specdec(?:\.[A-Za-z_]\w*)+)", all_text()))
    missing = []
    for name in sorted(names):
        parts = name.split(".")
        obj, i = None, len(parts)
        while i > 0:                       # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                i -= 1
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        if obj is None:
            missing.append(name)
    assert not missing, f"documented names that do not exist: {missing}"


def test_configuration_reference_is_up_to_date():
    from specdec.config_reference import reference
    with open(os.path.join(REPO, "docs", "configuration.md")) as f:
        assert f.read() == reference(), "docs/configuration.md is stale: run `python -m specdec.config_reference > docs/configuration.md`"


@dataclasses.dataclass
class _Shared:
    size: int = 4                # the shared size
    name: str = "a"              # the shared name


@dataclasses.dataclass
class _Extended(_Shared):
    name: str = "b"              # the extension's own name
    extra: bool = False          # the extension's own setting


def test_configuration_reference_reads_the_comments_of_extended_sections():
    """A section that extends another dataclass documents the inherited fields with their comments,
    and a field it declares again with its own comment."""
    from specdec.config_reference import field_comments, reference
    assert field_comments(_Extended) == {"size": "the shared size", "name": "the extension's own name",
                                         "extra": "the extension's own setting"}
    rows = {line.split("|")[1].strip(): line.split("|")[5].strip() for line in reference().splitlines()
            if line.startswith("| `")}
    for section in ("early_exit", "layer_skip"):          # both extend ViewDraftConfig
        assert rows[f"`{section}.num_tokens`"] == "chain length (start value when adaptive)"
        assert rows[f"`{section}.draft_cost`"].startswith("draft forward / target forward")
