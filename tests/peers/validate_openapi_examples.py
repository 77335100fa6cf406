#!/usr/bin/env python3
"""Validates every example in OpenAPI 3.1 files against its own definition,
with an implementation independent of the broker: PyYAML reads the files and
the `jsonschema` package validates (Draft 2020-12, the dialect of OpenAPI 3.1
schemas), resolving `$ref`s inside each file and to JSON files beside it
(`refusal.schema.json`).

Usage: validate_openapi_examples.py OPENAPI.yaml...

An example is:
- `example`, or each `examples.NAME.value`, of a media type, a parameter or a
  header: checked against its `schema`;
- each item of a schema's own `examples` list: checked against that schema.

Prints one JSON object per example: {"file", "at" (a JSON pointer), "valid",
"errors"}. Exit codes: 0 done (whatever the verdicts), 3 a dependency is
missing, 4 a file is not YAML.
"""

import json
import os
import sys

INSTALL = (
    "install the test dependencies with scripts/install-test-deps "
    "(the PyPI packages jsonschema and PyYAML)"
)

try:
    import yaml
except ImportError:
    print(f"missing dependency: the PyPI package PyYAML; {INSTALL}", file=sys.stderr)
    sys.exit(3)
try:
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012
except ImportError:
    print(f"missing dependency: the PyPI package jsonschema; {INSTALL}", file=sys.stderr)
    sys.exit(3)


def pointer(parts):
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def registry_for(path, doc):
    """The OpenAPI document under its file URI, and every JSON schema beside
    it under its file URI and its `$id`."""
    reg = Registry()
    uri = "file://" + os.path.abspath(path)
    reg = reg.with_resource(uri, Resource.from_contents(doc, default_specification=DRAFT202012))
    folder = os.path.dirname(os.path.abspath(path))
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name), "rb") as f:
                contents = json.load(f)
            r = Resource.from_contents(contents, default_specification=DRAFT202012)
            reg = reg.with_resource("file://" + os.path.join(folder, name), r)
            if isinstance(contents, dict) and "$id" in contents:
                reg = reg.with_resource(contents["$id"], r)
    return uri, reg


def node_ref_parts(ref):
    return [p.replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")]


def examples_of(doc, path, node):
    """(pointer parts of the schema, pointer parts of the example, value)."""
    found = []

    def walk(n, parts):
        if isinstance(n, dict):
            has_schema = isinstance(n.get("schema"), dict)
            if has_schema and "example" in n:
                found.append((parts + ["schema"], parts + ["example"], n["example"]))
            if has_schema and isinstance(n.get("examples"), dict):
                for name, ex in n["examples"].items():
                    target = ex
                    if isinstance(ex, dict) and isinstance(ex.get("$ref"), str):
                        target = doc
                        for p in node_ref_parts(ex["$ref"]):
                            target = target[p]
                    if isinstance(target, dict) and "value" in target:
                        found.append((parts + ["schema"], parts + ["examples", name, "value"], target["value"]))
            if not has_schema and isinstance(n.get("examples"), list):
                for i, ex in enumerate(n["examples"]):
                    found.append((parts, parts + ["examples", i], ex))
            for k, v in n.items():
                if k == "examples" and isinstance(v, list) and not has_schema:
                    continue
                walk(v, parts + [k])
        elif isinstance(n, list):
            for i, v in enumerate(n):
                walk(v, parts + [i])

    walk(doc, [])
    return found


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for path in argv:
        try:
            with open(path, "rb") as f:
                doc = yaml.safe_load(f)
        except yaml.YAMLError as e:
            print(f"{path}: not YAML: {e}", file=sys.stderr)
            return 4
        uri, reg = registry_for(path, doc)
        for schema_at, example_at, value in examples_of(doc, path, doc):
            validator = Draft202012Validator({"$ref": uri + "#" + pointer(schema_at)}, registry=reg)
            try:
                errors = sorted(
                    ("/".join(str(p) for p in e.absolute_path) + ": " + e.message)
                    for e in validator.iter_errors(value)
                )
            except Exception as e:  # an unresolvable $ref is a failure too
                errors = [f"{type(e).__name__}: {e}"]
            print(json.dumps({"file": os.path.basename(path), "at": pointer(example_at),
                              "valid": not errors, "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
