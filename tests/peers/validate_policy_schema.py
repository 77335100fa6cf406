#!/usr/bin/env python3
"""Validates policy files against proto/policy.schema.json with an
independent implementation: Python's tomllib reads the TOML (not the Rust
`toml` crate), and the `jsonschema` package validates (Draft 2020-12).

Usage: validate_policy_schema.py SCHEMA FILE...

Prints one JSON object per line: {"file", "valid", "errors"}; a file that is
not valid TOML (or not UTF-8) is reported as invalid with the parse error.
Exit codes: 0 done (whatever the verdicts), 3 a dependency is missing,
4 the schema itself is not a valid Draft 2020-12 schema.
"""

import json
import sys

INSTALL = (
    "install the test dependencies with scripts/install-test-deps "
    "(needs Python >= 3.11 and the PyPI package jsonschema)"
)

try:
    import tomllib
except ImportError:  # Python < 3.11
    print(f"missing dependency: tomllib (Python >= 3.11); {INSTALL}", file=sys.stderr)
    sys.exit(3)

try:
    import jsonschema
    from jsonschema import Draft202012Validator
except ImportError:
    print(f"missing dependency: the PyPI package jsonschema; {INSTALL}", file=sys.stderr)
    sys.exit(3)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        schema = json.load(f)
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        print(f"the schema is invalid: {e.message}", file=sys.stderr)
        return 4
    validator = Draft202012Validator(schema)
    for path in argv[1:]:
        try:
            with open(path, "rb") as f:
                doc = tomllib.loads(f.read().decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            print(json.dumps({"file": path, "valid": False, "errors": [f"not TOML: {e}"]}))
            continue
        errors = sorted(
            ("/".join(str(p) for p in e.absolute_path) + ": " + e.message)
            for e in validator.iter_errors(doc)
        )
        print(json.dumps({"file": path, "valid": not errors, "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
