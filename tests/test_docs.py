"""The docs in docs/ and README.md against the code: they fail here when the two drift apart.

Checked: links and file paths resolve inside the repository; every `gc.` name a code span shows
exists; every public Python name, error class, CLI command and option, manifest and checkpoint
field and server route appears in docs/api.md.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import importlib
import pkgutil
import re
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
API = (ROOT / "docs" / "api.md").read_text()

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`((?:[^`\n]|\n(?!\s*\n))+)`")  # may wrap a line, not a paragraph
REPO_PATH = re.compile(r"(?:graphc|passes|backends|models|scripts|tests|docs)/[\w./-]*")


def _spans(text: str) -> list[str]:
    return CODE_SPAN.findall(FENCE.sub("", text))


def _identifiers_in_code(text: str) -> set[str]:
    return {name for span in _spans(text) for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


API_IDENTIFIERS = _identifiers_in_code(API)


def test_docs_folder_has_the_three_pages():
    assert {p.name for p in DOCS} >= {"architecture.md", "api.md", "adding-an-op.md"}


def test_readme_points_only_inside_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert "../shared" not in readme and "shared/" not in readme
    for page in ("docs/architecture.md", "docs/api.md", "docs/adding-an-op.md"):
        assert f"]({page})" in readme, f"README.md does not link {page}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve_to_files_in_the_repository(page: Path):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name}: link {target!r} leaves the repository"
        assert path.exists(), f"{page.name}: link {target!r} points to nothing"


def heading_anchors(text: str) -> set[str]:
    """The `#anchor`s GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated one suffixed `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_anchor_links(page: Path, text: str) -> list[str]:
    """Links `(#anchor)` and `(page.md#anchor)` whose anchor names no heading of that page."""
    broken = []
    for target in LINK.findall(text):
        path, _, anchor = target.partition("#")
        if not anchor or re.match(r"[a-z]+:", target):
            continue
        other = page if not path else (page.parent / path).resolve()
        if other.suffix == ".md" and other.exists():
            anchors = heading_anchors(text if other == page else other.read_text())
            broken += [] if anchor in anchors else [target]
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_anchor_links_name_a_heading(page: Path):
    assert broken_anchor_links(page, page.read_text()) == []


def test_a_broken_anchor_link_is_found():
    text = "# A `gc.x` page: one\n## Part\n## Part\n[a](#a-gcx-page-one) [b](#part-1) [c](#part-2) [d](#Part)"
    assert heading_anchors(text) == {"a-gcx-page-one", "part", "part-1"}
    assert broken_anchor_links(ROOT / "docs" / "api.md", text) == ["#part-2", "#Part"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_file_paths_named_in_code_spans_exist(page: Path):
    for span in _spans(page.read_text()):
        if any(c in span for c in "<*{ "):  # a pattern (`rules_<family>.py`), not one path
            continue
        match = REPO_PATH.fullmatch(span.split("::")[0])
        if match:
            assert (ROOT / match.group(0)).exists(), f"{page.name} names {span!r}, which does not exist"


def test_every_top_level_name_resolves():
    assert [name for name in gc.__all__ if getattr(gc, name, None) is None] == []
    assert gc.checkpoint.CheckpointError.__module__ == "graphc.runtime.checkpoint"


GC_NAME = re.compile(r"(?<![\w.])gc((?:\.[A-Za-z_]\w*)+)(?![\w*])")  # not a pattern: `gc.fake_quantize_*`


def unresolved_gc_names(text: str) -> list[str]:
    """The `gc.a.b` names in code spans that name no attribute (or module) under `graphc`; an
    all-caps part (`gc.NAME`) is a placeholder."""
    wrong = []
    for span in _spans(text):
        for dotted in GC_NAME.findall(span):
            parts = dotted.lstrip(".").split(".")
            if any(part.isupper() for part in parts):
                continue
            try:
                _resolve("gc." + ".".join(parts))
            except (AttributeError, ImportError):
                wrong.append(f"gc.{'.'.join(parts)}")
    return sorted(set(wrong))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_gc_names_in_code_spans_resolve(page: Path):
    assert unresolved_gc_names(page.read_text()) == []


def test_a_renamed_gc_name_is_found():
    text = "`gc.optim.AdamW(lr)` `gc.deploy.tritn(m)` `gc.NAME` `gc.fake_quantize_*` `gc.TrainingInterrupted`"
    assert unresolved_gc_names(text) == ["gc.TrainingInterrupted", "gc.deploy.tritn"]


def test_every_top_level_name_is_documented():
    missing = [name for name in gc.__all__ if not re.search(rf"\bgc\.{re.escape(name)}\b", API)]
    assert missing == [], f"docs/api.md does not document gc.{', gc.'.join(missing)}"


@pytest.mark.parametrize("module", ["nn", "losses", "optim", "training", "deploy", "data"])
def test_every_public_name_of_a_submodule_is_documented(module: str):
    names = getattr(gc, module).__all__
    missing = [n for n in names if n not in API_IDENTIFIERS]
    assert missing == [], f"docs/api.md does not name gc.{module}.{missing}"


def _graphc_modules():
    for package in ("graphc", "graphc.passes", "graphc.backends"):
        pkg = importlib.import_module(package)
        yield pkg
        for info in pkgutil.walk_packages(pkg.__path__, f"{package}."):
            yield importlib.import_module(info.name)


def _subclasses(cls: type) -> set[type]:
    direct = set(cls.__subclasses__())
    return direct.union(*(_subclasses(c) for c in direct))


def test_every_error_class_is_documented():
    modules = {m.__name__ for m in _graphc_modules()}
    errors = {c for c in _subclasses(gc.GraphcError) if c.__module__ in modules}
    assert gc.GraphError in errors and len(errors) >= 8
    missing = sorted(c.__name__ for c in errors if c.__name__ not in API_IDENTIFIERS)
    assert missing == [], f"docs/api.md does not list the errors {missing}"


def _cli_commands():
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from cli_reference import commands
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return list(commands())


def test_every_cli_command_and_option_is_documented():
    commands = _cli_commands()
    assert {" ".join(words) for words, _ in commands} >= {"capture", "grad", "train", "serve", "deploy triton"}
    for words, command in commands:
        title = " ".join(["graphc", *words])
        assert f"`{title}`" in API, f"docs/api.md has no section for {title}"
        for param in command.params:
            for flag in (*param.opts, *param.secondary_opts):
                if flag.startswith("-"):
                    assert f"`{flag}`" in API.split(f"`{title}`", 1)[1], \
                        f"docs/api.md does not document {title} {flag}"


def test_cli_reference_block_is_the_generated_one():
    """docs/api.md's CLI block is what scripts/cli_reference.py writes (regenerate it with
    ``.venv/bin/python scripts/cli_reference.py --write docs/api.md``)."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    block = API.split(cli_reference.START, 1)[1].split(cli_reference.END, 1)[0]
    assert block.strip() == cli_reference.reference().strip(), \
        "docs/api.md's CLI reference is stale: run scripts/cli_reference.py --write docs/api.md"


def test_manifest_and_checkpoint_fields_are_documented():
    from graphc.compile.training import FlatBuffer, Manifest, Role, TensorEntry
    from graphc.runtime.checkpoint import CheckpointMeta

    fields = [*Manifest.model_fields, *FlatBuffer.model_fields, *TensorEntry.model_fields, *CheckpointMeta.model_fields]
    roles = list(Role.__args__)
    missing = [f for f in [*fields, *roles] if f not in API_IDENTIFIERS]
    assert missing == [], f"docs/api.md does not describe {missing}"


def test_every_server_route_is_documented():
    from graphc.serving.serve import create_app

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    app = create_app(gc.load(onnx.ModelProto.FromString(model.SerializeToString())), backend="numpy", name="relu")
    paths = {route.path for route in app.routes if route.path.startswith("/v2")}
    assert "/v2/models/{name}/infer" in paths
    missing = sorted(p for p in paths if f"`{p}`" not in API and f" {p}`" not in API)
    assert missing == [], f"docs/api.md does not list the routes {missing}"



ERROR_ROW = re.compile(r"^\| (`(?:gc|graphc)\.[^|]*)\| ([^|]+) \|", re.M)


def _resolve(dotted: str):
    """``gc.X`` or ``graphc.a.b.X``, importing modules on the way; a builtin's bare name."""
    if "." not in dotted:
        return getattr(builtins, dotted)
    head, *rest = dotted.split(".")
    obj = gc
    for i, part in enumerate(rest):
        obj = getattr(obj, part, None) or importlib.import_module(".".join(["graphc", *rest[:i + 1]]))
    return obj


def errors_table_mismatches(api: str) -> list[str]:
    """What api.md's errors table says wrongly: each row's names (the class and its aliases) are one
    class, which derives from every class the row's second column lists."""
    table = api.split("### Errors", 1)[1].split("\n## ", 1)[0]
    rows = ERROR_ROW.findall(table)
    assert len(rows) >= 15, "api.md's errors table not found"
    wrong = []
    for names, bases in rows:
        cls, *aliases = [_resolve(n) for n in re.findall(r"`([\w.]+)`", names)]
        wrong += [f"{names.strip()}: {a} is another class" for a in aliases if a is not cls]
        wrong += [f"{cls.__name__} is not a {b}" for b in re.findall(r"`([\w.]+)`", bases)
                  if not issubclass(cls, _resolve(b))]
    return wrong


def test_the_errors_table_gives_each_class_its_bases():
    assert errors_table_mismatches(API) == []
    stale = API.replace("| `gc.InputError` | `ValueError` |", "| `gc.InputError` | `TypeError` |")
    assert errors_table_mismatches(stale) == ["InputError is not a TypeError"]


SIGNATURE = re.compile(r"^((?:gc|F)(?:\.\w+)+|[A-Z]\w*)\((.*)\)$", re.S)
# calls the prose shows with a value other than the default (a usage, not a signature)
USAGES = {"BatchNorm2d(momentum=None)", "ReLU(inplace=True)", 'gc.optim.AdamW(lr, no_decay=("*.bias", "*norm*"))'}


def documented_default_mismatches(text: str) -> list[str]:
    """A `gc.f(x, k=v)`, `F.f(...)` or `gc.nn` layer `Name(...)` code span whose keyword `k` the
    function does not take, or whose default in the code is a value other than `v` (None and
    required in the code are not compared: None often stands for a default the doc spells out)."""
    wrong = []
    for span in _spans(text):
        m = SIGNATURE.match(" ".join(span.split()))
        if not m or " ".join(span.split()) in USAGES:
            continue
        name, args = m.groups()
        head, *rest = name.split(".")
        obj = {"gc": gc, "F": gc.nn.functional}.get(head, gc.nn)
        for part in rest if head in ("gc", "F") else [head]:
            obj = getattr(obj, part, None)
        if obj is None or not callable(obj):
            continue
        try:
            call = ast.parse(f"f({re.sub(r'(^|,) ?[*/] ?(?=,|$)', '', args)})", mode="eval").body
            params = inspect.signature(obj).parameters
        except (SyntaxError, ValueError, TypeError):
            continue  # a choice list ("a"|"b"), an elision (...)
        if any(p.kind == p.VAR_KEYWORD for p in params.values()) or not all(
                isinstance(a, (ast.Name, ast.Starred)) for a in call.args):
            continue  # a usage: gc.batch_norm(x, None, None, training=True)
        for kw in call.keywords:
            try:
                value = ast.literal_eval(kw.value)
            except ValueError:
                continue  # a name or expression, not a value
            if value is Ellipsis:
                continue
            if kw.arg not in params:
                wrong.append(f"`{span}`: {name} takes no {kw.arg}")
            elif params[kw.arg].default not in (None, inspect.Parameter.empty) and params[kw.arg].default != value:
                wrong.append(f"`{span}`: {name}'s {kw.arg} defaults to {params[kw.arg].default!r}")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_documented_keyword_defaults_are_the_codes(page: Path):
    """Over 200 spans hold keywords: each keyword is the function's, with its default."""
    assert documented_default_mismatches(page.read_text()) == []


def test_a_stale_documented_default_is_found():
    text = "".join(page.read_text() for page in PAGES)
    assert all(f"`{u}`" in " ".join(text.split()) for u in USAGES), "a usage listed in USAGES left the docs"
    assert documented_default_mismatches("`gc.dropout(x, p=0.25, training=True)` `F.pad(x, pad, valu=None)`") == [
        "`gc.dropout(x, p=0.25, training=True)`: gc.dropout's p defaults to 0.5",
        "`F.pad(x, pad, valu=None)`: F.pad takes no valu"]
