// Builds the notebook-cell MCP App into ONE self-contained HTML file, mcp_sandbox/ui/cell.html:
// src/cell.html with the bundled script (ext-apps' App and ours) and src/cell.css inlined. Nothing
// is loaded from the network. The output depends only on the sources and the locked packages.
//
//   node cell/build.mjs            write mcp_sandbox/ui/cell.html
//   node cell/build.mjs --check    rebuild in memory; exit 1, saying so, if the committed file differs
//   node cell/build.mjs --host DIR write only DIR/host.html: the browser tests' host page (AppBridge)
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..");
const output = join(root, "mcp_sandbox", "ui", "cell.html");
const nodePaths = [join(here, "node_modules")];

/** zod's locales other than English (most of its size): nothing here sets another. */
const englishOnly = {
  name: "zod-english-only",
  setup(build) {
    build.onResolve(
      { filter: /\/locales\/index\.js$/ },
      (args) =>
        args.importer.includes(`${join("node_modules", "zod")}`)
          ? { path: join(dirname(args.importer), "..", "locales", "en.js"), namespace: "zod-locales" }
          : undefined,
    );
    build.onLoad({ filter: /.*/, namespace: "zod-locales" }, (args) => ({
      contents: `export { default as en } from ${JSON.stringify(args.path)};`,
      resolveDir: dirname(args.path),
    }));
  },
};

async function bundle(entry) {
  const result = await esbuild.build({
    entryPoints: [entry],
    bundle: true,
    write: false,
    format: "iife",
    platform: "browser",
    target: "es2022",
    minify: true,
    legalComments: "none",
    charset: "utf8",
    nodePaths,
    plugins: [englishOnly],
    logLevel: "error",
  });
  return result.outputFiles[0].text;
}

/** Inline `script` into an HTML <script> element: it must not end the element early. */
function inlineScript(script) {
  const escaped = script.replace(/<\/(script)/gi, "<\\/$1");
  if (/<\/script|<!--/i.test(escaped)) throw new Error("the bundle cannot be inlined");
  return escaped;
}

function fill(template, parts) {
  let html = template;
  for (const [marker, text] of Object.entries(parts)) {
    if (!html.includes(marker)) throw new Error(`${marker} is missing from the template`);
    html = html.replace(marker, () => text);
  }
  return html;
}

export async function buildCell() {
  const [template, css, script] = await Promise.all([
    readFile(join(here, "src", "cell.html"), "utf8"),
    readFile(join(here, "src", "cell.css"), "utf8"),
    bundle(join(here, "src", "cell.ts")),
  ]);
  const html = fill(template, {
    "/*STYLE*/": css.replace(/<\/(style)/gi, "<\\/$1"),
    "/*SCRIPT*/": inlineScript(script),
  });
  // Self-contained: no external script, stylesheet or image.
  if (/<(script|link|img|iframe)[^>]*\s(src|href)\s*=/i.test(html)) {
    throw new Error("cell.html must load nothing: an element has a src or href");
  }
  return html;
}

export async function buildHost() {
  const script = await bundle(join(root, "tests", "browser", "host.ts"));
  return `<!doctype html>\n<html><head><meta charset="utf-8"><title>test host</title></head>` +
    `<body><div id="frame-holder"></div><script>${inlineScript(script)}</script></body></html>\n`;
}

const args = process.argv.slice(2);
const hostAt = args.indexOf("--host");
if (hostAt !== -1) {
  const folder = args[hostAt + 1];
  if (!folder) throw new Error("--host needs a folder");
  await mkdir(folder, { recursive: true });
  await writeFile(join(folder, "host.html"), await buildHost());
  console.log(`wrote ${join(folder, "host.html")}`);
} else {
  const html = await buildCell();
  if (args.includes("--check")) {
    let committed = null;
    try {
      committed = await readFile(output, "utf8");
    } catch {
      // missing: not current
    }
    if (committed !== html) {
      console.error(
        `${relative(process.cwd(), output)} is not current: rebuild it with \`node cell/build.mjs\` and commit it`,
      );
      process.exit(1);
    }
    console.log(`${relative(process.cwd(), output)} is current (${html.length} bytes)`);
  } else {
    await writeFile(output, html);
    console.log(`wrote ${relative(process.cwd(), output)} (${html.length} bytes)`);
  }
}
