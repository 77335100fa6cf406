"""Independent checks of proto/ for tests/it/mcp/proto.rs, run with .venv's Python.

    python check_proto.py validate SCHEMA FILE...
        One JSON line per file: {"file", "valid", "errors"} (jsonschema,
        Draft 2020-12). Exit 4 when the schema itself is not valid.
    python check_proto.py sdk PROTO_MCP_DIR
        Reads the MCP examples with the Python `mcp` SDK's own types and
        prints one JSON line of what it understood.
    python check_proto.py client CLIENT_SRC REFUSAL.json
        Builds the MCP answer to the refusal with the Python client's
        `credbroker_client.mcp.link_answer` (the README's MCP sections point
        to it), for both protocol versions, and prints what it built.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def validate(schema_path: str, files: list[str]) -> int:
    from jsonschema import Draft202012Validator

    schema = json.loads(Path(schema_path).read_text(encoding="utf-8"))
    try:
        Draft202012Validator.check_schema(schema)
    except Exception as e:  # noqa: BLE001 - reported, then a distinct exit code
        print(f"the schema is not a valid Draft 2020-12 schema: {e}", file=sys.stderr)
        return 4
    v = Draft202012Validator(schema)
    for f in files:
        doc = json.loads(Path(f).read_text(encoding="utf-8"))
        errors = sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc))
        print(json.dumps({"file": f, "valid": not errors, "errors": errors}))
    return 0


def sdk(d: str) -> int:
    import mcp_types as t
    from mcp.shared.exceptions import UrlElicitationRequiredError

    p = Path(d)
    load = lambda n: json.loads((p / n).read_text(encoding="utf-8"))  # noqa: E731
    out: dict = {}

    e25 = t.JSONRPCError.model_validate(load("2025-11-25-url-elicitation-required.json"))
    parsed = UrlElicitationRequiredError.from_error(e25.error)
    out["2025"] = {
        "code": e25.error.code,
        "elicitations": [e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in parsed.elicitations],
    }

    r26 = t.JSONRPCResponse.model_validate(load("2026-07-28-input-required.json"))
    ir = t.InputRequiredResult.model_validate(r26.result)
    out["2026"] = {
        "result_type": ir.result_type,
        "input_requests": {
            k: {"method": v.method, "params": v.params.model_dump(by_alias=True, exclude_none=True, mode="json")}
            for k, v in (ir.input_requests or {}).items()
        },
        "request_state": ir.request_state,
    }

    retry = t.JSONRPCRequest.model_validate(load("2026-07-28-retry.json"))
    params = t.CallToolRequestParams.model_validate(retry.params)
    out["retry"] = {
        "method": retry.method,
        "name": params.name,
        "arguments": params.arguments,
        "request_state": params.request_state,
        "input_responses": {
            k: (v.model_dump(by_alias=True, exclude_none=True, mode="json") if hasattr(v, "model_dump") else v)
            for k, v in (params.input_responses or {}).items()
        },
    }

    rej = t.JSONRPCError.model_validate(load("2026-07-28-request-state-rejected.json"))
    out["rejected"] = {"code": rej.error.code, "message": rej.error.message, "data": rej.error.data}

    form = t.JSONRPCResponse.model_validate(load("form-only-client.json"))
    ctr = t.CallToolResult.model_validate(form.result)
    out["form_only"] = {"is_error": ctr.is_error, "text": ctr.content[0].text}
    print(json.dumps(out))
    return 0


def client(client_src: str, refusal_path: str) -> int:
    from mcp import UrlElicitationRequiredError

    sys.path.insert(0, client_src)
    from credbroker_client.errors import LinkRequired, refusal
    from credbroker_client.mcp import link_answer

    r = json.loads(Path(refusal_path).read_text(encoding="utf-8"))
    err = refusal(400, r, None, 0.0)
    if not isinstance(err, LinkRequired):
        raise SystemExit(f"the refusal did not map to LinkRequired: {type(err).__name__}")
    out = {}
    for version in ("2025-11-25", "2026-07-28"):
        try:
            res = link_answer(err, version, name="connect_github")
            out[version] = {"result": res.model_dump(by_alias=True, exclude_none=True, mode="json")}
        except UrlElicitationRequiredError as e:
            out[version] = {"error": e.error.model_dump(by_alias=True, exclude_none=True, mode="json")}
    print(json.dumps(out))
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "client":
        return client(sys.argv[2], sys.argv[3])
    if len(sys.argv) >= 3 and sys.argv[1] == "validate":
        return validate(sys.argv[2], sys.argv[3:])
    if len(sys.argv) == 3 and sys.argv[1] == "sdk":
        return sdk(sys.argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
