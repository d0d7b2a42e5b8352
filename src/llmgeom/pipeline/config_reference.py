"""config/README.md, generated from the schema's descriptions (``python -m llmgeom.pipeline.config_reference
--markdown > config/README.md``; ``tests/unit/pipeline/test_config_schema.py`` compares the committed file)."""

from __future__ import annotations

from llmgeom.pipeline.schema import ConfigError, describe_schema, read_schema


def _md(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _rows(schema: dict, path: str):
    for key, sub in (schema.get("properties") or {}).items():
        dotted = f"{path}.{key}" if path else key
        yield dotted, sub
        if isinstance(sub, dict):
            yield from _rows(sub, dotted)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("properties"):
        yield from _rows(extra, f"{path}.<name>")


def config_markdown(schema: dict) -> str:
    """config/README.md: every key of the schema (dotted path, ``<name>`` for a user-chosen name), what it
    accepts (:func:`describe_schema`), its default and its description; one table per top-level section.

    Raises:
        ConfigError: a key without a description (every key documents itself in the schema).
    """
    import json

    missing = [k for k, sub in _rows(schema, "") if not (isinstance(sub, dict) and sub.get("description"))]
    if missing:
        raise ConfigError(f"schema keys without a description: {', '.join(missing)}; add a description: to each "
                          "in src/llmgeom/pipeline/config.schema.yaml")
    out = ["# Configuration reference", "",
           "<!-- Generated from src/llmgeom/pipeline/config.schema.yaml by `python -m llmgeom.pipeline.config_reference "
           "--markdown > config/README.md`; do not edit by hand (tests/unit/pipeline/test_config_schema.py compares). -->", "",
           _md(schema.get("description", "")), "",
           "Every default below is filled in before the workflow runs; a key you do not set takes it. Required "
           "top-level keys: " + ", ".join(f"`{k}`" for k in schema.get("required", [])) + ". `<name>` stands for a "
           "name you choose (a model, a prompt set, a task).", ""]
    for top, sub in (schema.get("properties") or {}).items():
        out += [f"## `{top}`", "", _md(sub.get("description", "")), ""]
        readers = [(d, n["x-function"]) for d, n in [(top, sub), *_rows(sub, top)]
                   if isinstance(n, dict) and n.get("x-function")]
        for dotted, funcs in readers:
            funcs = [funcs] if isinstance(funcs, str) else funcs
            out += [f"`{dotted}` is read by {', '.join(f'`{f}`' for f in funcs)} (each key a keyword argument; "
                    f"`llmgeom.defaults(\"{dotted}\")` gives these defaults)" + (
                        "; keys marked *(rules)* are read by the rules themselves." if any(
                            isinstance(n, dict) and n.get("x-workflow") for n in
                            (_node(schema, dotted).get("properties") or {}).values()) else "."), ""]
        rows = list(_rows(sub, top))
        if rows:
            out += ["| key | valid | default | description |", "|---|---|---|---|"]
            for dotted, node in rows:
                default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
                req = " (required)" if dotted.rsplit(".", 1)[-1] in _parent(schema, dotted).get("required", []) else ""
                rules = " *(rules)*" if node.get("x-workflow") else ""
                out.append(f"| `{dotted}`{req}{rules} | {_md(describe_schema(node))} | {default} | "
                           f"{_md(node['description'])} |")
            out.append("")
    return "\n".join(out)


def _node(schema: dict, dotted: str) -> dict:
    return _parent(schema, dotted + ".x")


def _parent(schema: dict, dotted: str) -> dict:
    node = schema
    for part in dotted.split(".")[:-1]:
        node = node["additionalProperties"] if part == "<name>" else node["properties"][part]
    return node


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m llmgeom.pipeline.config_reference --markdown > config/README.md")
    print(config_markdown(read_schema()), end="")
