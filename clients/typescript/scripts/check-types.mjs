// The drift check: regenerate src/openapi.ts from docs/openapi.json into a temporary file
// with the same command as `npm run generate`, and fail on any difference.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const committed = join(root, "src", "openapi.ts");
const scratch = mkdtempSync(join(tmpdir(), "memstream-types-"));
const fresh = join(scratch, "openapi.ts");
try {
  // The generate script's own arguments, with the output redirected.
  const script = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).scripts.generate;
  const args = script.split(/\s+/).slice(1);
  args[args.indexOf("-o") + 1] = fresh;
  const bin = join(root, "node_modules", "openapi-typescript", "bin", "cli.js");
  execFileSync(process.execPath, [bin, ...args], { cwd: root, stdio: ["ignore", "ignore", "inherit"] });
  const want = readFileSync(fresh, "utf8").split("\n");
  const have = readFileSync(committed, "utf8").split("\n");
  const line = want.findIndex((text, i) => text !== have[i]);
  if (line >= 0 || want.length !== have.length) {
    const at = line >= 0 ? line : Math.min(want.length, have.length);
    console.error(
      `src/openapi.ts is out of date with docs/openapi.json (first difference at line ${at + 1}:\n` +
        `  committed: ${JSON.stringify(have[at] ?? "<end of file>")}\n` +
        `  generated: ${JSON.stringify(want[at] ?? "<end of file>")})\n` +
        "run `npm run generate` in clients/typescript and commit the result",
    );
    process.exitCode = 1;
  } else {
    console.log("src/openapi.ts matches docs/openapi.json");
  }
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
