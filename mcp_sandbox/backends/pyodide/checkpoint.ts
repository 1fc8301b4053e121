// Checkpoints: a session's Python state as data, taken in idle time and put into another sandbox
// (another process, another server) when its own is gone (docs/checkpoints.md).
//
// Every sandbox of one build reaches the same clean point from the same memory snapshot by the
// same steps, so its WebAssembly memory there is the same, byte for byte apart from a few
// timestamps. A checkpoint is therefore the memory words that differ from the clean memory (a
// bitmap per changed page, then the words it marks) plus the files the session made; restoring
// writes them over a clean sandbox. Words, not whole pages: a session's writes are scattered over
// pages that are mostly left as they were, and whole pages made checkpoints several times larger. Native libraries loaded
// since the clean point are loaded again the same way first (linker.ts). What lives only in
// JavaScript cannot be carried: a checkpoint is refused while Python holds JavaScript objects or
// a C callback (ctypes) changed the function table, and it says what else is lost (open files;
// pending asyncio tasks and timers are JavaScript's too).
import type { LinkerRecord } from "./linker.ts";
import {
  Bytes,
  type CleanShape,
  type CleanState,
  copyInto,
  decode,
  encode,
  MAX_CLEAN_DRIFT_PAGES,
  PAGE,
  tableLength,
  taint,
  taintsSoFar,
  Words,
} from "./recycle.ts";

const MAGIC = "MCPSCKP2";
const WORDS_PER_PAGE = PAGE / 4;
const MASK_BYTES = WORDS_PER_PAGE / 8;
const MAX_HEADER_BYTES = 64 * 1024 * 1024;

type FileEntry = {
  path: string;
  kind: "file" | "dir" | "link";
  mode: number;
  mtime: number;
  size: number;
  target?: string;
};

type Header = {
  // The clean point it was taken against: a sandbox with another one cannot restore it.
  clean: CleanShape;
  memory: number;
  // The JS reference table's length when it was taken (its slots past the clean ones are empty).
  table: number;
  // The values Pyodide interned since the clean point (strings, mostly): memory holds their indices.
  immortals: Primitive[];
  pages: number[];
  files: FileEntry[];
  removed: string[];
  cwd: string;
  // What reached past recycling's checks in the session (ctypes, say): the memory still holds
  // what it did, so the sandbox it is restored into must not be recycled either.
  tainted: string[];
  // The native libraries loaded since the clean point, to load again before the memory is copied.
  linker: LinkerRecord;
};

export type CheckpointOutcome =
  | { saved: true; blob: Uint8Array; lost: string[] }
  | { saved: false; reason: string };

// The clean memory is read by index only, through `clean.memoryWords` (recycle.ts's Bytes).
function hashPages(words: Int32Array, count: number): { hashes: Int32Array; bytes: Uint8Array } {
  const buffer = new ArrayBuffer(count * 4);
  const hashes = new Words(buffer);
  for (let page = 0; page < count; page++) {
    let hash = 0;
    const end = (page + 1) * WORDS_PER_PAGE;
    for (let i = page * WORDS_PER_PAGE; i < end; i++) hash = (Math.imul(hash, 31) + words[i]) | 0;
    hashes[page] = hash;
  }
  return { hashes, bytes: new Bytes(buffer) };
}

function cleanHashes(clean: CleanState): { hashes: Int32Array; bytes: Uint8Array } {
  return clean.pageHashes ??= hashPages(clean.memoryWords, clean.memoryLength / PAGE);
}

// Pages of `heap` that differ from the clean memory (pages past it: those not all zero).
function changedPages(now: Int32Array, before: Int32Array, beforeLength: number): number[] {
  const pages: number[] = [];
  for (let page = 0; page < now.length / WORDS_PER_PAGE; page++) {
    const start = page * WORDS_PER_PAGE;
    for (let i = start; i < start + WORDS_PER_PAGE; i++) {
      if (now[i] !== (i < beforeLength ? before[i] : 0)) {
        pages.push(page);
        break;
      }
    }
  }
  return pages;
}

// The words of `heap` that differ from the clean memory, by page: the pages with any, a bitmap
// of them per page, and their values in order. Pages are found first: most are unchanged, and
// a page's first difference ends its scan there.
function changedWords(
  heap: Uint8Array,
  clean: CleanState,
): { pages: number[]; masks: Uint8Array; words: Int32Array } {
  const now = new Words(heap.buffer, 0, heap.length / 4);
  const before = clean.memoryWords;
  const beforeLength = clean.memoryLength / 4;
  const pages = changedPages(now, before, beforeLength);
  const masks = new Bytes(pages.length * MASK_BYTES);
  const words = new Words(pages.length * WORDS_PER_PAGE);
  let count = 0;
  for (let p = 0; p < pages.length; p++) {
    const start = pages[p] * WORDS_PER_PAGE;
    const past = start >= beforeLength;
    for (let byte = 0; byte < MASK_BYTES; byte++) {
      let bits = 0;
      for (let bit = 0; bit < 8; bit++) {
        const i = start + byte * 8 + bit;
        if (now[i] !== (past ? 0 : before[i])) {
          bits |= 1 << bit;
          words[count++] = now[i];
        }
      }
      masks[p * MASK_BYTES + byte] = bits;
    }
  }
  return { pages, masks, words: words.slice(0, count) };
}

function bitsSet(masks: Uint8Array): number {
  let count = 0;
  for (let byte of masks) {
    for (; byte; byte &= byte - 1) count++;
  }
  return count;
}

// Why Python's state cannot be carried to another sandbox now, or null.
function whyNotPortable(clean: CleanState, jsHolders: () => string[]): string | null {
  const module = clean.module;
  if (clean.cleanSlotsChanged()) {
    return "a C callback (ctypes) changed the function table, which cannot be carried to another sandbox; " +
      "restart the session (reset_session) if it must survive";
  }
  if (module.stackSave() !== clean.stackPointer) return "Python is still running";
  if (internedSince(clean) === null) {
    return "Pyodide keeps a JavaScript object for good that the session made, which cannot be carried to " +
      "another sandbox; restart the session (reset_session) if it must survive";
  }
  for (let i = 0; i < clean.table.length; i++) {
    if (module.__hiwire_get(i) !== clean.table[i]) return jsObjectsHeld(jsHolders);
  }
  for (let i = clean.table.length;; i++) {
    let value: unknown;
    try {
      value = module.__hiwire_get(i);
    } catch {
      break;
    }
    if (value !== undefined && value !== null) return jsObjectsHeld(jsHolders);
  }
  return null;
}

type Primitive = string | number | boolean | null;

// The values interned since the clean point, or null when one is not plain data.
function internedSince(clean: CleanState): Primitive[] | null {
  const module = clean.module;
  const values: Primitive[] = [];
  for (let i = clean.immortals; i < tableLength(module, clean.immortals, module.__hiwire_immortal_get); i++) {
    const value = module.__hiwire_immortal_get(i);
    const plain = typeof value === "string" || typeof value === "boolean" || value === null ||
      (typeof value === "number" && Number.isFinite(value));
    if (!plain) return null;
    values.push(value as Primitive);
  }
  return values;
}

function jsObjectsHeld(jsHolders: () => string[]): string {
  let names: string[] = [];
  try {
    names = jsHolders();
  } catch { /* the names are a courtesy */ }
  const which = names.length ? ` (${names.slice(0, 5).join(", ")})` : "";
  return `variables hold JavaScript objects${which}, which cannot be carried to another sandbox; ` +
    "convert them to Python values (.to_py()) or delete them (del name) and the next call is checkpointed";
}

function walkFiles(clean: CleanState): { entries: FileEntry[]; contents: Uint8Array[]; removed: string[] } {
  const FS = clean.module.FS;
  const entries: FileEntry[] = [];
  const contents: Uint8Array[] = [];
  const seen = new Set<string>();
  const visit = (path: string): void => {
    seen.add(path);
    if (clean.skipped.has(path)) return; // data/ is the host's, /proc and /dev are devices
    const node = FS.lookupPath(path, { follow: false }).node;
    const before = clean.files.get(path);
    const changed = !before || before.node !== node || before.mode !== node.mode || before.mtime !== node.mtime ||
      before.ctime !== node.ctime;
    if (FS.isDir(node.mode)) {
      if (changed) entries.push({ path, kind: "dir", mode: node.mode, mtime: node.mtime, size: 0 });
      for (const name of FS.readdir(path)) {
        if (name !== "." && name !== "..") visit(path === "/" ? `/${name}` : `${path}/${name}`);
      }
    } else if (changed && FS.isLink(node.mode)) {
      entries.push({ path, kind: "link", mode: node.mode, mtime: node.mtime, size: 0, target: FS.readlink(path) });
    } else if (changed && FS.isFile(node.mode)) {
      const bytes = FS.readFile(path);
      entries.push({ path, kind: "file", mode: node.mode, mtime: node.mtime, size: bytes.length });
      contents.push(bytes);
    }
  };
  visit("/");
  const removed = [...clean.files.keys()].filter((path) => !seen.has(path) && !insideSkipped(clean, path));
  return { entries, contents, removed };
}

function insideSkipped(clean: CleanState, path: string): boolean {
  for (const skipped of clean.skipped) if (path.startsWith(`${skipped}/`)) return true;
  return false;
}

// What a restored session will not have: the files it has open.
function whatIsLost(clean: CleanState): string[] {
  const FS = clean.module.FS;
  const lost: string[] = [];
  const opened = (stream: unknown, fd: number) => stream && !clean.streams.has(fd);
  const open = FS.streams.flatMap((stream, fd) =>
    opened(stream, fd) ? [(stream as { path?: string }).path ?? `fd ${fd}`] : []
  );
  if (open.length) lost.push(`open files are closed in a restored session (${open.slice(0, 5).join(", ")})`);
  return lost;
}

export function takeCheckpoint(clean: CleanState, jsHolders: () => string[]): CheckpointOutcome {
  const builtIn = clean.builtInChanged();
  if (builtIn !== null) return { saved: false, reason: `its JavaScript built-ins changed: ${builtIn}` };
  const reason = whyNotPortable(clean, jsHolders);
  if (reason !== null) return { saved: false, reason };
  const heap = new Bytes(clean.module.HEAP8.buffer);
  const { pages, masks, words } = changedWords(heap, clean);
  const { entries, contents, removed } = walkFiles(clean);
  const header: Header = {
    clean: clean.shape,
    memory: heap.length,
    table: tableLength(clean.module, clean.table.length),
    immortals: internedSince(clean)!,
    pages,
    files: entries,
    removed,
    cwd: clean.module.FS.cwd(),
    tainted: taintsSoFar(),
    linker: clean.linker.record(),
  };
  const head = encode(JSON.stringify(header));
  const hashes = cleanHashes(clean).bytes;
  const fileBytes = contents.reduce((total, bytes) => total + bytes.length, 0);
  const hashBytes = clean.memoryLength / PAGE * 4;
  const size = MAGIC.length + 4 + head.length + hashBytes + masks.length + words.byteLength + fileBytes;
  const blob = new Bytes(size);
  let at = 0;
  const put = (bytes: Uint8Array, length = bytes.length): void => {
    copyInto(blob, bytes, at);
    at += length;
  };
  put(encode(MAGIC));
  new DataView(blob.buffer).setUint32(at, head.length, true);
  at += 4;
  put(head);
  put(hashes, hashBytes);
  put(masks);
  put(new Uint8Array(words.buffer));
  for (const bytes of contents) put(bytes);
  return { saved: true, blob, lost: whatIsLost(clean) };
}

function parse(
  blob: Uint8Array,
  clean: CleanState,
): { header: Header; hashes: Int32Array; masks: Uint8Array; words: Int32Array; filesAt: number } | string {
  if (blob.length < MAGIC.length + 4 || decode(blob.subarray(0, MAGIC.length)) !== MAGIC) {
    return "it is not a checkpoint";
  }
  const headLength = new DataView(blob.buffer, blob.byteOffset).getUint32(MAGIC.length, true);
  if (headLength > MAX_HEADER_BYTES || MAGIC.length + 4 + headLength > blob.length) return "its header is cut short";
  let header: Header;
  try {
    header = JSON.parse(decode(blob.subarray(MAGIC.length + 4, MAGIC.length + 4 + headLength)));
  } catch {
    return "its header is not JSON";
  }
  const cleanPages = clean.memoryLength / PAGE;
  const pagesAt = MAGIC.length + 4 + headLength + cleanPages * 4;
  if (JSON.stringify(header.clean) !== JSON.stringify(clean.shape)) {
    return "it was taken in a sandbox that started differently (another build or other settings)";
  }
  if (!Number.isInteger(header.table) || header.table < clean.table.length || header.table > 1 << 24) {
    return "its table size is invalid";
  }
  const pageCount = header.memory / PAGE;
  if (!Number.isInteger(pageCount) || header.memory < clean.memoryLength || header.memory > 2 ** 32) {
    return "its memory size is invalid";
  }
  let previous = -1;
  for (const page of header.pages) {
    if (!Number.isInteger(page) || page <= previous || page >= pageCount) return "its page list is invalid";
    previous = page;
  }
  for (const entry of header.files) {
    if (typeof entry.path !== "string" || !entry.path.startsWith("/") || entry.path.split("/").includes("..")) {
      return "a file path is invalid";
    }
    const inData = entry.path === clean.dataDir || entry.path.startsWith(`${clean.dataDir}/`);
    if (inData || insideSkipped(clean, entry.path)) return "a file path is invalid";
    if (!["file", "dir", "link"].includes(entry.kind) || !Number.isInteger(entry.size) || entry.size < 0) {
      return "a file entry is invalid";
    }
  }
  if (!validLinker(header.linker, header.memory)) return "its native library list is invalid";
  const wordsAt = pagesAt + header.pages.length * MASK_BYTES;
  if (wordsAt > blob.length) return "its length does not match its header";
  const masks = blob.subarray(pagesAt, wordsAt);
  const filesAt = wordsAt + bitsSet(masks) * 4;
  const fileBytes = header.files.reduce((total, entry) => total + entry.size, 0);
  if (filesAt + fileBytes !== blob.length) return "its length does not match its header";
  const hashes = new Int32Array(blob.slice(MAGIC.length + 4 + headLength, pagesAt).buffer);
  // Copied: the words must be 4-byte aligned to be read as such.
  const words = new Int32Array(blob.slice(wordsAt, filesAt).buffer);
  return { header, hashes, masks, words, filesAt };
}

function validLinker(linker: LinkerRecord, memory: number): boolean {
  const whole = (value: unknown, below: number) =>
    Number.isInteger(value) && (value as number) >= 0 && (value as number) < below;
  return typeof linker === "object" && linker !== null && Array.isArray(linker.libraries) &&
    Array.isArray(linker.allocations) && Array.isArray(linker.got) && whole(linker.table, 1 << 24) &&
    linker.libraries.every((library) =>
      typeof library.name === "string" && library.name.startsWith("/") && typeof library.global === "boolean" &&
      typeof library.nodelete === "boolean" && Array.isArray(library.handles) &&
      library.handles.every((handle) => whole(handle, memory))
    ) &&
    linker.allocations.every((allocation) =>
      whole(allocation.at, memory) && whole(allocation.size, memory) && whole(allocation.table, 1 << 24)
    ) &&
    linker.got.every((entry) => Array.isArray(entry) && typeof entry[0] === "string" && Number.isFinite(entry[1]));
}

// Puts a checkpoint into this sandbox, which must be at its clean point. Null when it worked;
// otherwise why not, and the sandbox must not be used again (it may be half restored).
export function restoreCheckpoint(clean: CleanState, blob: Uint8Array): string | null {
  const parsed = parse(blob, clean);
  if (typeof parsed === "string") return `the checkpoint cannot be restored: ${parsed}`;
  const { header, hashes, masks, words, filesAt } = parsed;
  const own = cleanHashes(clean).hashes;
  const stored = new Set(header.pages);
  let drift = 0;
  for (let page = 0; page < clean.memoryLength / PAGE; page++) {
    if (own[page] !== hashes[page] && !stored.has(page)) drift++;
  }
  if (drift > MAX_CLEAN_DRIFT_PAGES) {
    return `the checkpoint was taken in a sandbox whose clean memory differs in ${drift} pages`;
  }
  const module = clean.module;
  // Interned values are found by index: this sandbox must hold the same ones at the same places.
  const immortals = Array.isArray(header.immortals) ? header.immortals : [];
  const interned = tableLength(module, clean.immortals, module.__hiwire_immortal_get);
  for (let i = clean.immortals; i < Math.min(interned, clean.immortals + immortals.length); i++) {
    if (module.__hiwire_immortal_get(i) !== immortals[i - clean.immortals]) {
      return "this sandbox interned other values before (a recycled one); a new sandbox can restore it";
    }
  }
  for (const value of immortals.slice(interned - clean.immortals)) module.__hiwire_immortal_add(value);
  // Grown by the runtime's own growMemory, so every view of the memory sees the new size. (Not by
  // malloc: a block freed after a growth that fell short is handed back to the next malloc without
  // growing, and Pyodide 0.29 has no _malloc on its module.) The allocator's state is in the pages.
  if (module.HEAP8.length < header.memory) module.growMemory(header.memory);
  if (module.HEAP8.length < header.memory) return `memory could not grow to ${header.memory} bytes`;
  // Files first: the native libraries load from them, before the memory that links them is copied.
  const files = restoreFiles(clean, header, blob.subarray(filesAt));
  if (files !== null) return files;
  const linked = clean.linker.replay(header.linker);
  if (linked !== null) return `the checkpoint's native libraries could not be loaded again: ${linked}`;
  // A finalizer of this sandbox's proxies would give back a reference in the checkpoint's memory.
  clean.forgetFinalizers();
  clean.resetMemory();
  const heap32 = new Words(module.HEAP8.buffer);
  let next = 0;
  header.pages.forEach((page, p) => {
    for (let byte = 0; byte < MASK_BYTES; byte++) {
      const bits = masks[p * MASK_BYTES + byte];
      if (bits === 0) continue;
      const at = page * WORDS_PER_PAGE + byte * 8;
      for (let bit = 0; bit < 8; bit++) if (bits & (1 << bit)) heap32[at + bit] = words[next++];
    }
  });
  module.stackRestore(clean.stackPointer);
  // The memory's JS reference table may hand out slots up to the length it had: empty ones here.
  for (let i = tableLength(module, clean.table.length); i < header.table; i++) {
    if (module.__hiwire_set(i, null) < 0) return "the JS reference table could not grow";
  }
  for (const reason of Array.isArray(header.tainted) ? header.tainted : []) taint(`${reason} (before a restore)`);
  return null;
}

function restoreFiles(clean: CleanState, header: Header, contents: Uint8Array): string | null {
  const FS = clean.module.FS;
  FS.ignorePermissions = true;
  try {
    for (const path of [...header.removed].sort((a, b) => b.length - a.length)) {
      const node = FS.lookupPath(path, { follow: false }).node;
      if (FS.isDir(node.mode)) FS.rmdir(path);
      else FS.unlink(path);
    }
    let at = 0;
    for (const entry of header.files) {
      const exists = FS.analyzePath(entry.path, true).exists;
      if (entry.kind === "dir") {
        if (!exists) FS.mkdir(entry.path, 0o700);
      } else {
        if (exists) FS.unlink(entry.path);
        if (entry.kind === "link") FS.symlink(entry.target!, entry.path);
        else FS.writeFile(entry.path, contents.subarray(at, at + entry.size));
        at += entry.size;
      }
    }
    // Modes and times last, deepest first: writing into a folder moves its time.
    for (const entry of [...header.files].reverse()) {
      if (entry.kind === "link") continue;
      FS.chmod(entry.path, entry.mode & 0o7777);
      FS.utime(entry.path, entry.mtime, entry.mtime);
    }
    FS.chdir(header.cwd);
    return null;
  } catch (error) {
    return `the checkpoint's files could not be restored: ${error}`;
  } finally {
    FS.ignorePermissions = false;
  }
}
