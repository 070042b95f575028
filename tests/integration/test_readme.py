"""The examples of the README and of the docs run as printed. Every fenced code block of
README.md and of docs/*.md is a `sh` or `python` block (a bare fence: Python when its block
parses as Python, else shell), run here against one stack (a worker of the order line
delivering to a downstream double; an intake in dev mode, one that takes the examples' keys
for their signed requests, one that takes alice's admin token for the audit's), or says in
its fence why it is not run: ```` ```sh not-run: <why> ````. A new block is run unless its
author decides otherwise, on its page, where a reader sees it.

Each block runs as a reader would run it: a shell or the venv's Python, in a directory of
its own holding the `.venv` it activates, with what its section of the page has the reader
set in the environment (the stack's `PIPELINE_` settings, the keys, `ALICE_TOKEN`) and
`INTAKE_URL`, the intake the examples send to; within 30 s each. It must exit 0, print no
error answer of the intake, and every record it sends (each `"business_no": "…"` it names)
must be in the journal afterwards."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.downstream import Gauged
from tests.support.harness import Harness
from tests.support.processes import REPO

# The pages whose examples run: the README, then every page of docs/.
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN = ("sh", "python")
NOT_RUN = "not-run:"
SHOP_1 = {"shop-1": "its-secret-of-32-random-bytes-xx"}
SHOP_2 = {
    "shop-2": {
        "kind": "standard-webhooks",
        "secret": "whsec_O58MKnHYTlWmwPGeLXtMg+ah8F2SxHs+ig1fbBsuepQ=",
    }
}
ALICE_TOKEN = "alices-admin-token-of-32-bytes-x"
# The intakes of the stack, by what they take; each section's examples (a section of the
# README or of a docs page, by its heading) go to one,
# with the variables the section has its reader set (the others: the dev-mode intake).
DEV, SIGNED, ADMIN = "dev", "signed", "admin"
SECTIONS: dict[str, tuple[str, dict[str, str]]] = {
    "Signed requests": (SIGNED, {"PIPELINE_INTAKE_KEYS": json.dumps(SHOP_1)}),
    "Standard Webhooks sources": (SIGNED, {"PIPELINE_INTAKE_KEYS": json.dumps(SHOP_1 | SHOP_2)}),
    "Audit": (
        ADMIN,
        {
            "PIPELINE_ADMIN_TOKENS": json.dumps({"alice": ALICE_TOKEN}),
            "ALICE_TOKEN": ALICE_TOKEN,
        },
    ),
}
SNIPPET_TIMEOUT_S = 30
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+)(?P<info>.*)$")
HEADING = re.compile(r"^#+\s+(?P<title>.+)$")
# The intake's error answer, `{"error": {"code": …`, as the examples print it.
ERROR_ANSWER = re.compile(r'"error":\s*\{\s*"code"')
SENT = re.compile(r'"business_no": "(?P<business_no>[^"]+)"')


@dataclass(frozen=True)
class Block:
    page: str  # its file, from the repository's root
    line: int  # of its opening fence, counted from 1
    info: str
    section: str
    code: str

    @property
    def language(self) -> str:
        """Its fence's; a bare fence's block is Python if it parses as Python, else shell
        (so a bare block runs too)."""
        if self.info:
            return self.info.split(maxsplit=1)[0]
        try:
            ast.parse(self.code)
        except SyntaxError:
            return "sh"
        return "python"

    @property
    def why_not_run(self) -> str | None:
        """The reason its fence gives for not running it (None: it runs)."""
        rest = self.info.partition(" ")[2].strip()
        return rest.removeprefix(NOT_RUN).strip() if rest.startswith(NOT_RUN) else None

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.language or 'no language'}, {self.section})"


def page_blocks(page: Path) -> list[Block]:
    """Every fenced code block of `page`, with the heading it is under."""
    name = str(page.relative_to(REPO))
    blocks: list[Block] = []
    section = ""
    opened: tuple[int, str, str] | None = None  # the open block's line, indent and info
    body: list[str] = []
    for number, text in enumerate(page.read_text().splitlines(), start=1):
        fence = FENCE.match(text)
        if opened is None:
            if fence:
                opened, body = (number, fence["indent"], fence["info"].strip()), []
            elif heading := HEADING.match(text):
                section = heading["title"].strip()
            continue
        if fence and not fence["info"].strip():
            line, indent, info = opened
            code = "\n".join(b.removeprefix(indent) for b in body)
            blocks.append(Block(page=name, line=line, info=info, section=section, code=code + "\n"))
            opened = None
        else:
            body.append(text)
    assert opened is None, f"{name}:{opened[0]}: a code block is never closed"
    return blocks


def every_block() -> list[Block]:
    """Every fenced code block of every page, the README's first."""
    return [block for page in PAGES for block in page_blocks(page)]


RUN_BLOCKS = [b for b in every_block() if b.why_not_run is None]
# Every block, those not run shown as skipped, with its page's reason.
EVERY_BLOCK = [
    pytest.param(
        block,
        id=f"{Path(block.page).name}-line-{block.line}",
        marks=[pytest.mark.skip(reason=f"{block}: not run: {block.why_not_run}")]
        if block.why_not_run is not None
        else [],
    )
    for block in every_block()
]


def test_every_block_runs_or_says_why_not() -> None:
    blocks = every_block()
    assert blocks
    for block in blocks:
        if block.why_not_run is None:
            assert block.language in RUN, (
                f"{block}: a block runs unless its fence says why not "
                f"(```sh {NOT_RUN} <why>); this one is neither {' nor '.join(RUN)}"
            )
        else:
            assert block.why_not_run, f"{block}: {NOT_RUN} needs a reason"
    assert any(block.language == "python" for block in RUN_BLOCKS)
    assert {block.page for block in blocks} > {"README.md"}, "the docs' blocks are run too"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Stack:
    harness: Harness
    intakes: dict[str, str]  # their URLs, by what they take
    workdir: Path


@pytest.fixture(scope="module")
def stack(module_harness: Harness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack for every block: a worker of the order line delivering to a downstream
    double, an intake in dev mode, one that takes the examples' keys and one that takes
    alice's admin token; and the directory the examples run in, with the `.venv` that "Try
    it" activates."""
    harness = module_harness
    downstream = Gauged().start()
    try:
        harness.configure(lines__order__downstream_url=f"{downstream.url}/in")
        harness.start_worker("order")
        intakes = {DEV: harness.start_intake()}
        harness.configure(intake_keys=json.dumps(SHOP_1 | SHOP_2))
        intakes[SIGNED] = harness.start_intake()
        harness.configure(intake_keys="{}", admin_tokens=json.dumps({"alice": ALICE_TOKEN}))
        intakes[ADMIN] = harness.start_intake()
        harness.runtime()  # the journal's reader, built while the stack's settings are set
        workdir = tmp_path_factory.mktemp("reader")
        (workdir / ".venv").symlink_to(sys.prefix, target_is_directory=True)
        yield Stack(
            harness=harness,
            intakes={name: str(client.base_url).rstrip("/") for name, client in intakes.items()},
            workdir=workdir,
        )
    finally:
        downstream.stop()


def reader_environment(stack: Stack, block: Block) -> dict[str, str]:
    """What a reader's shell holds when running `block`: the stack's settings, what the
    block's section has the reader set (keys, tokens), its intake in `INTAKE_URL` and in
    the settings `pipeline send` reads, and the venv's commands first on the PATH."""
    intake, variables = SECTIONS.get(block.section, (DEV, {}))
    url = stack.intakes[intake]
    own = ("PIPELINE_INTAKE_KEYS", "PIPELINE_ADMIN_TOKENS")
    env = {name: value for name, value in stack.harness.env.items() if name not in own}
    host, _, port = url.removeprefix("http://").rpartition(":")
    env |= variables | {
        "INTAKE_URL": url,
        "PIPELINE_INTAKE_HOST": host,
        "PIPELINE_INTAKE_PORT": port,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "200",
    }
    return env


def run_snippet(argv: list[str], *, cwd: Path, env: dict[str, str]) -> Ran:
    """Run a block in a process group of its own; past `SNIPPET_TIMEOUT_S` the whole group
    (the shell and the commands it started) is killed and the test fails."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=SNIPPET_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=10)
        pytest.fail(f"not done within {SNIPPET_TIMEOUT_S} s:\n{stdout}\n{stderr}")
    return Ran(returncode=process.returncode, stdout=stdout, stderr=stderr)


@pytest.mark.parametrize("block", EVERY_BLOCK)
def test_the_block_runs_as_printed(stack: Stack, block: Block) -> None:
    if block.language == "sh":
        bash = shutil.which("bash")
        assert bash, "the shell examples need bash"
        argv = [bash, "-e", "-o", "pipefail", "-c", block.code]
    else:
        argv = [sys.executable, "-c", block.code]
    ran = run_snippet(argv, cwd=stack.workdir, env=reader_environment(stack, block))
    assert ran.returncode == 0, f"{block} exited {ran.returncode}:\n{ran.stdout}\n{ran.stderr}"
    assert not ERROR_ANSWER.search(ran.stdout), f"{block}: an error answer\n{ran.stdout}"
    sent = {match["business_no"] for match in SENT.finditer(block.code)}
    journaled = {record.business_no for record in stack.harness.records()}
    assert sent <= journaled, (
        f"{block} sent {sorted(sent - journaled)}: not journaled\n{ran.stdout}"
    )
