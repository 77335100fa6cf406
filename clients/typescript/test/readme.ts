// The fenced code blocks of a README, with the hidden parts the tests add:
// the same reader as clients/python/tests/readme_blocks.py, whose docstring
// describes the comments (`<!-- readme-test: prelude`, `after`, `skip:`).

import { readFileSync } from "node:fs";

/** One fenced block: where it is, its language, its text and what the test adds. */
export interface Block {
  source: string;
  line: number;
  lang: string;
  code: string;
  prelude: string;
  after: string;
  skip: string | undefined;
}

export const where = (b: Block): string => `${b.source}:${b.line}`;

const FENCE = /^```([A-Za-z0-9_+-]*)\s*$/;
const COMMENT = /^<!-- readme-test: (prelude|after|skip)(?::\s*(.*?))?\s*(-->)?$/;

/** Every fenced block of `path` (shown as `name`), in order, with its hidden parts. */
export function blocks(path: string, name: string): Block[] {
  const lines = readFileSync(path, "utf8").split("\n");
  const found: Block[] = [];
  let pending: Record<string, string> = {};
  let i = 0;
  while (i < lines.length) {
    const line = lines[i] ?? "";
    const c = COMMENT.exec(line);
    if (c) {
      const [, kind = "", rest = "", closed] = c;
      if (kind === "skip") {
        if (!closed || !rest) throw new Error(`${path}:${i + 1}: write <!-- readme-test: skip: REASON -->`);
        pending["skip"] = rest;
        i += 1;
        continue;
      }
      const body: string[] = [];
      i += 1;
      while (i < lines.length && (lines[i] ?? "").trim() !== "-->") body.push(lines[i++] ?? "");
      if (i === lines.length) throw new Error(`${path}: the readme-test ${kind} comment is not closed`);
      pending[kind] = body.join("\n") + "\n";
      i += 1;
      continue;
    }
    const f = FENCE.exec(line);
    if (f && f[1]) {
      const start = i + 1;
      const body: string[] = [];
      i += 1;
      while (i < lines.length && !(lines[i] ?? "").startsWith("```")) body.push(lines[i++] ?? "");
      found.push({
        source: name,
        line: start,
        lang: f[1],
        code: body.join("\n") + "\n",
        prelude: pending["prelude"] ?? "",
        after: pending["after"] ?? "",
        skip: pending["skip"],
      });
      pending = {};
    } else if (f) {
      // A fence without a language: a plain block, skipped to its end.
      i += 1;
      while (i < lines.length && !(lines[i] ?? "").startsWith("```")) i += 1;
      pending = {};
    } else if (line.trim() && Object.keys(pending).length > 0) {
      throw new Error(`${path}:${i + 1}: a readme-test comment is not right before a block`);
    }
    i += 1;
  }
  return found;
}
