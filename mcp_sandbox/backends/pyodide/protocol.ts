// Generated from mcp_sandbox/protocol.py by mcp_sandbox/backends/pyodide/typescript.py: do not edit.
export const MAX_TOOL_REPLY_CHARS = 8388608;
export const SYNC_REPLY_MAX_BYTES = 33619968;
export const SYNC_DATA_INITIAL_BYTES = 65536;
export const SYNC_STATE = 0;
export const SYNC_LENGTH = 1;
export const SYNC_WAITING = 0;
export const SYNC_REPLY_READY = 1;
export const SYNC_INTERRUPTED = 2;
export const INTERRUPT_SIGNAL = 2;
export const SIGNAL_INTERRUPT = 0;
export const SIGNAL_KILL = 1;
export const JIT_WARM_UP_IDLE_MS = 250;
export const JIT_WARM_UP_ROUNDS_AT_START = 3;
export const GUEST_RUNTIME_MODULE = "mcp_sandbox.guest";
export const OUTPUT_DIR = "output";
export const DATA_DIR = "data";
export const PASSING_KINDS = ["progress", "tool_call", "describe", "ready", "fatal"] as const;
export const REPLY_INTERRUPTED = '{"ok": false, "interrupted": true}';
export const RUNNER_TOKEN_ENV = "MCP_SANDBOX_RUNNER_TOKEN";
export const HOST_LINE_KEY_LABEL = "mcp-sandbox host lines\n";
export const HOST_LINE_NONCE_BYTES = 12;
export const HOST_LINE_TAG_BYTES = 16;

export type OutputLimits = {
  max_files: number;
  max_bytes: number;
  max_figures: number;
};

export type GuestLimits = {
  max_output_chars: number;
  max_kept_output_chars: number;
  output: OutputLimits;
};

export type GuestFile = {
  path: string;
  size: number;
  data?: string;
};

export type KeptText = {
  text: string;
  total: number;
};

export type GuestTable = {
  kind: "DataFrame" | "Series";
  source: "display" | "value";
  shape: number[];
  columns: string[];
  dtypes: string[];
  index_name: string | null;
  index: string[];
  rows: ((number | string | boolean | null)[])[];
  positions: number[];
  printed: number[] | null;
};

export type GuestOutcome = {
  success: boolean;
  stdout: string;
  stderr: string;
  result: string | null;
  error_type: string | null;
  error: string | null;
  truncated: boolean;
  files?: GuestFile[];
  figures?: string[];
  notes?: string[];
  tables?: GuestTable[];
  kept_stdout?: KeptText;
  kept_stderr?: KeptText;
};

export type InitMessage = {
  type: "init";
  token?: string;
  guest_modules: [string, string][];
  limits: GuestLimits;
  pyodide_dir?: string;
  data_dir?: string;
  packages_dir?: string;
  allow_net?: string;
  snapshot?: string;
  code_cache?: string;
  code_cache_sha256?: string;
  checkpoint_dir?: string;
  preload?: string[];
  memory_max_bytes?: number;
};

export type RunMessage = {
  type: "run";
  id: number;
  code: string;
  tools?: string;
};

export type InterruptMessage = {
  type: "interrupt";
  id: number;
};

export type KillMessage = {
  type: "kill";
  id: number;
};

export type JitWarmUpMessage = {
  type: "jit_warm_up";
  rounds: number;
};

export type ToolResultMessage = {
  type: "tool_result";
  call: number;
  reply: string;
};

export type RecycleMessage = {
  type: "recycle";
  id: number;
};

export type CheckpointMessage = {
  type: "checkpoint";
  id: number;
  file: string;
};

export type RestoreMessage = {
  type: "restore";
  id: number;
  file: string;
};

export type CloseMessage = {
  type: "close";
};

export type HostMessage =
  | InitMessage
  | RunMessage
  | InterruptMessage
  | KillMessage
  | JitWarmUpMessage
  | ToolResultMessage
  | RecycleMessage
  | CheckpointMessage
  | RestoreMessage
  | CloseMessage;

export type HostEnvelope = {
  sandbox: number;
  msg: HostMessage;
};

export type ReadyMessage = {
  type: "ready";
  python: string;
  pyodide: string | null;
  load_ms: number;
  preload_failed?: string[];
  phases?: [string, number][];
  code_cache?: "used" | "refused" | "damaged";
  snapshot_read?: "pages" | "whole";
};

export type ResultMessage = {
  type: "result";
  id: number;
  outcome: GuestOutcome;
};

export type CrashedMessage = {
  type: "crashed";
  id: number | null;
  message: string;
  renewed?: boolean;
  recycled?: boolean;
};

export type FatalMessage = {
  type: "fatal";
  message: string;
};

export type EndedMessage = {
  type: "ended";
  message: string;
};

export type ProgressMessage = {
  type: "progress";
  line: string;
};

export type ToolCallMessage = {
  type: "tool_call";
  call: number;
  server: string;
  tool: string;
  arguments: string;
};

export type DescribeMessage = {
  type: "describe";
  call: number;
  query: string;
  limit: number;
};

export type RecycledMessage = {
  type: "recycled";
  id: number;
  clean: boolean;
  reason: string | null;
  ms: number;
};

export type CheckpointedMessage = {
  type: "checkpointed";
  id: number;
  saved: boolean;
  reason: string | null;
  lost: string[];
  bytes: number;
  ms: number;
};

export type RestoredMessage = {
  type: "restored";
  id: number;
  restored: boolean;
  reason: string | null;
  ms: number;
};

export type RunnerMessage =
  | ReadyMessage
  | ResultMessage
  | CrashedMessage
  | FatalMessage
  | EndedMessage
  | ProgressMessage
  | ToolCallMessage
  | DescribeMessage
  | RecycledMessage
  | CheckpointedMessage
  | RestoredMessage;

export type WorkerInit = {
  type: "init";
  guest_modules: [string, string][];
  limits: GuestLimits;
  signals: Int32Array;
  syncState: Int32Array;
  syncData: SharedArrayBuffer;
  control: MessagePort;
  packagesDir?: string;
  snapshot?: string;
  preload?: string[];
  memoryMaxBytes?: number;
  module?: WebAssembly.Module;
  clean?: WorkerCleanMemory;
  script?: string;
  codeCache?: Uint8Array;
  codeCacheDamaged?: boolean;
  spare?: boolean;
};

export type WorkerAhead = {
  type: "ahead";
  script: string;
  codeCache?: Uint8Array;
  codeCacheDamaged?: boolean;
};

export type DataFile = {
  path: string;
  bytes: Uint8Array;
};

export type WorkerData = {
  type: "data";
  files: DataFile[];
  removed: string[];
};

export type WorkerRecycle = {
  type: "recycle";
  id: number;
};

export type WorkerRecycled = {
  type: "recycled";
  id: number;
  clean: boolean;
  reason: string | null;
  ms: number;
  dataLost: boolean;
};

export type WorkerCheckpoint = {
  type: "checkpoint";
  id: number;
};

export type WorkerRestore = {
  type: "restore";
  id: number;
  blob: Uint8Array;
};

export type WorkerKill = {
  type: "kill";
  id: number;
};

export type ControlRequest =
  | WorkerRecycle
  | WorkerCheckpoint
  | WorkerRestore
  | WorkerKill
  | WorkerData
  | RunMessage
  | JitWarmUpMessage
  | ToolResultMessage;

export type ControlAnswer = {
  json: string;
  blob?: Uint8Array;
};

export type WorkerRecycledCrash = {
  crashed: number;
  message: string;
  dataLost: boolean;
};

export type WorkerModule = {
  module: WebAssembly.Module;
};

export type WorkerWarmedUp = {
  warmedUp: true;
};

export type WorkerCleanMemory = {
  cleanMemory: Uint8Array;
  fingerprint: string;
  copied: Int32Array;
  zero: Int32Array;
  snapshot?: SnapshotPages;
};

export type SnapshotPages = {
  identity: string;
  header: Uint8Array;
  memoryBytes: number;
  copied: Int32Array;
  zero: Int32Array;
};

export type WorkerMessage =
  | WorkerInit
  | WorkerAhead;

export type WorkerPost = {
  id: number | null;
  json: string;
  exiting: boolean;
  syncCall?: number;
};
