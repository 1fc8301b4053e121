"""Every setting, read from `MCP_SANDBOX_*` environment variables, a `.env` file, or CLI flags."""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Self, get_args, get_origin

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import CLI_SUPPRESS, BaseSettings, CliSuppress, SettingsConfigDict

from mcp_sandbox.backends.registry import AUTO, AUTO_ORDER, BACKENDS, backend_names
from mcp_sandbox.protocol import OutputLimits

if TYPE_CHECKING:
    BackendName = str
else:
    # The names the table holds at import: the flag's choices and the docs'. `_known_backend`
    # checks the table as it is then, so a backend registered later is valid too.
    BackendName = Literal[backend_names()]
PolicyName = Literal["off", "strict"]
IsolationName = Literal["auto", "bubblewrap", "landlock", "none"]
ResultTextName = Literal["compact", "json"]


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/mcp-sandbox`, else `~/.cache/mcp-sandbox`"""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mcp-sandbox"


class Settings(BaseSettings):
    """Server settings. Each field is `MCP_SANDBOX_<NAME>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="MCP_SANDBOX_", env_file=".env", extra="ignore")

    backend: BackendName = Field(
        AUTO,
        description=f"Which sandbox runs code: {AUTO}, the first of {', '.join(AUTO_ORDER)} that starts; "
        + "; ".join(f"{name}, {entry.summary}" for name, entry in BACKENDS.items())
        + ".",
    )
    policy: PolicyName = Field(
        "off",
        description="strict: reject code that imports outside an allowlist or uses escape-hatch builtins "
        "and dunders, before it runs. Defense in depth, not a boundary.",
    )
    timeout: float = Field(30.0, gt=0, description="Default seconds a call may run.")
    max_timeout: float = Field(300.0, gt=0, description="Upper bound for a caller's `timeout`.")
    interrupt_grace: float = Field(
        2.0, gt=0, description="Seconds an interrupted program gets to stop before its sandbox is killed."
    )
    max_output_chars: int = Field(
        32_768, ge=256, description="Cap on stdout, stderr, result and error, each (head and tail kept)."
    )
    result_text: ResultTextName = Field(
        "compact",
        description="What a tool result's text block (what most clients hand the model) holds: compact, "
        "what a REPL would show plus a line for each unusual fact; json, the structured content's JSON, "
        "as MCP suggests for clients that read only text and want every field.",
    )
    max_kept_output_chars: int = Field(
        1_000_000,
        ge=0,
        description="Of a stdout or stderr that was cut, how many characters (from its start) are kept "
        "whole and readable through the result's resource link; 0 keeps none.",
    )
    max_kept_output_mb: float = Field(
        64.0,
        ge=0,
        description="Memory for kept whole outputs across all calls; past it the oldest are dropped. "
        "A session's stay while it lives; a session-less call's for session_ttl seconds.",
    )
    max_code_chars: int = Field(200_000, ge=1, description="Largest program accepted, in characters.")
    pool_size: int = Field(2, ge=0, description="Sandboxes kept started and ready for new sessions.")
    max_sessions: int = Field(16, ge=1, description="Sessions alive at once; past it calls are refused.")
    session_ttl: float = Field(600.0, gt=0, description="Seconds an idle session lives.")
    acquire_timeout: float = Field(
        60.0, gt=0, description="Seconds a call waits for a free sandbox before it gets an error."
    )
    start_timeout: float = Field(60.0, gt=0, description="Seconds a new sandbox may take to start.")
    memory_mb: int = Field(
        512,
        ge=64,
        description="Memory per sandbox: subprocess, its address space (RLIMIT_AS); pyodide, its WebAssembly "
        "memory's maximum (MemoryError past it) and V8 heap, with a host-side watchdog as the last resort.",
    )
    sandboxes_per_process: int = Field(
        4,
        ge=1,
        le=64,
        description="pyodide: sandboxes one Deno process hosts, each a worker of its own, all of one "
        "principal. A new sandbox in a running process starts in a fraction of a new process's time and "
        "shares its compiled code; a process-wide failure (a V8 heap out of memory, or one of them ending "
        "it) costs all of them their live state (each session comes back from its checkpoint, saying so). "
        "None reads the host's messages to the others (they are sealed), but any of them can take them, "
        "so that a call waits out its timeout (docs/security.md, co-hosted sandboxes): more than 1 where "
        "one principal's sessions may cost each other a call. 4 (bench/README.md): under a mixed load with "
        "crashes, less than half the CPU of a process each; 1: a process each.",
    )
    allow_net: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9.\-:\[\]]+(,[A-Za-z0-9.\-:\[\]]+)*$",
        description="pyodide: hosts (host or host:port, comma-separated) code may reach; unset: none.",
    )
    recycle: bool = Field(
        True,
        description="pyodide: put a sandbox a caller is done with (a call without a session, an ended "
        "session) back into its clean state in place, in milliseconds, and reuse it; false: every such "
        "caller gets a new process (about 0.4 s of a core each). docs/clean-sandbox.md says what is reset "
        "and what is checked.",
    )
    checkpoints: bool = Field(
        True,
        description="pyodide, subprocess: save each session's state once it is idle after a call, so a "
        "sandbox killed (memory limit, a timeout's grace period, a crash) or a server restarted (with "
        "state_dir) brings the session back from its last checkpoint instead of losing it.",
    )
    state_dir: Path | None = Field(
        None,
        description="Folder for saved sessions (kept in a 0700 sessions/ inside it): with it, a restarted "
        "server resumes them; unset: a private temporary folder removed at exit.",
    )
    state_url: str | None = Field(
        None,
        description="Where saved sessions and leases live, as a URL: redis://host:6379/0 (or rediss:// for "
        "TLS) keeps them in Redis (docs/deploy.md); a path or file:// URL is a folder, as state_dir.",
    )
    state_key_prefix: str = Field(
        "mcp-sandbox:",
        min_length=1,
        description="With a redis:// state_url: what every key the server writes starts with, so "
        "deployments sharing one Redis keep apart.",
    )
    hibernate_after: float = Field(
        120.0,
        ge=0,
        description="pyodide, subprocess: a session idle this many seconds is written to the store and its "
        "sandbox given back, freeing its memory; its next call brings it back as it was (0: never).",
    )
    lease_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="Instances sharing state_dir: how long one's claim on a session lasts unless renewed "
        "(every third of it). A call for a session another instance holds asks it to hand the session "
        "over, and waits at most this long (at least 10 s); a dead instance's sessions move within it.",
    )
    stateless_http: bool = Field(
        False,
        description="Streamable HTTP: serve each request on its own, so any instance behind a load balancer "
        "can answer it; clients still get an Mcp-Session-Id to route on (docs/deploy.md).",
    )
    max_live_sandboxes: int = Field(
        0,
        ge=0,
        description="pyodide, subprocess: the most sessions holding a sandbox at once; past it, the least "
        "recently used idle session is hibernated (0: no limit but max_sessions).",
    )
    principal_max_sessions: int = Field(
        0,
        ge=0,
        description="Sessions one principal may have open at once; past it, its new sessions are refused. "
        "0: half of max_sessions (rounded up) on a server with a tokens file or an OAuth issuer, so no one "
        "principal can take them all; on any other (one principal): no limit but max_sessions.",
    )
    principal_max_live_sandboxes: int = Field(
        0,
        ge=0,
        description="Sessions of one principal holding a sandbox at once; past it, a session of its that "
        "needs one is refused until one of its sessions hibernates or is reset (0: no limit of its own).",
    )
    principal_max_running_calls: int = Field(
        0,
        ge=0,
        description="Calls of one principal running or waiting for a sandbox at once; past it, its calls are "
        "refused (0: no limit of its own). Whatever it is, calls waiting for a sandbox are served round "
        "robin across principals, so one principal's flood delays another's call by at most one of its own.",
    )
    principal_calls_per_minute: int = Field(
        0,
        ge=0,
        description="Calls one principal may make in any 60 seconds; past it, its calls are refused "
        "(0: no limit).",
    )
    max_state_mb: int = Field(
        512, ge=1, description="Largest state one session's checkpoint may hold, in MB (before compression)."
    )
    max_store_mb: int = Field(
        8192, ge=1, description="Disk all saved sessions together may use, in MB (compressed)."
    )
    pyodide_warm_up_rounds: int = Field(
        100,
        ge=0,
        le=10_000,
        description="pyodide: a sandbox asked to (a pooled one, or a session's after its first call) uses "
        "idle time to run a sample program this many times so V8 compiles Pyodide's hot code; once one "
        "sandbox of a Deno process has run them all, the process's others skip it, since they run the "
        "same compiled code (0: off).",
    )
    pyodide_tier_up: bool = Field(
        True,
        description="pyodide: V8 recompiles Pyodide's hot WebAssembly with its optimizing compiler, in "
        "background threads. false: baseline code only; a runner process then costs about 0.9 CPU-s "
        "less to start and serve its first call, and Python runs about 3.5x slower. For short-lived "
        "servers on few cores, such as a test suite's.",
    )
    isolation: IsolationName = Field(
        "auto",
        description="subprocess: the OS sandbox around each worker. auto: the strongest that works here, "
        "in order bubblewrap (namespaces, a read-only root, seccomp), landlock (Landlock + seccomp, where "
        "namespaces are refused), none (rlimits only, with a warning); each fallback is logged with its "
        "reason.",
    )
    require_isolation: bool = Field(
        False, description="subprocess: refuse to start rather than run workers with no OS sandbox."
    )
    worker_uids: str = Field(
        "64000-64999",
        pattern=r"^[1-9][0-9]*(-[1-9][0-9]*)?$",
        description="subprocess, server run as root: the host uids workers run under, one each (FIRST-LAST), "
        "so process limits hold per worker.",
    )
    cpu_seconds: int = Field(
        900, ge=1, description="subprocess: CPU seconds a worker may use in its life (RLIMIT_CPU)."
    )
    max_open_files: int = Field(256, ge=16, description="subprocess: open files per worker (RLIMIT_NOFILE).")
    max_file_mb: int = Field(
        64, ge=1, description="subprocess: largest file a worker may write, in MB (RLIMIT_FSIZE)."
    )
    max_processes: int = Field(
        32,
        ge=1,
        description="subprocess: processes/threads a worker may add (RLIMIT_NPROC; as root, held by giving "
        "each worker its own uid; see worker_uids).",
    )
    deno_path: Path | None = Field(None, description="Deno binary to use; default: the `deno` package's.")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where Deno keeps Pyodide (downloaded once), and the memory snapshot and code cache "
        "sandboxes start from (made once per version of each part; those no server used for a week "
        "are removed).",
    )
    data_dir: Path | None = Field(
        None, description="Host folder that sandboxed code can read (never write) at data/."
    )
    output_dir: Path | None = Field(
        None, description="Host folder where files from output/ are also copied, under <session>/."
    )
    max_output_files: int = Field(20, ge=0, description="Files from output/ returned per call.")
    max_output_mb: float = Field(
        10.0, gt=0, description="Bytes of figures and output files returned per call, in MB."
    )
    max_figures: int = Field(10, ge=0, description="matplotlib figures returned per call.")
    packages_dir: Path | None = Field(
        None,
        description="pyodide: folder of Pyodide packages and pure-Python wheels that imports load from "
        "(filled at start with default_packages, and by `mcp-sandbox fetch`); default <cache_dir>/packages.",
    )
    default_packages: str = Field(
        "numpy,pandas,matplotlib",
        description="pyodide: packages of the Pyodide distribution (comma-separated; their dependencies "
        "too) fetched into the packages folder in the background at start, once, where the package index "
        "is reachable; empty: none.",
    )
    preload_packages: str | None = Field(
        None,
        description="pyodide: packages of the packages folder (comma-separated) every sandbox loads and "
        "imports before its clean point, so an import costs nothing and recycling, checkpoints and "
        "restores hold them by construction; unset: the default packages present in the folder at start; "
        "empty: none.",
    )
    package_index_url: str | None = Field(
        None,
        pattern=r"^https?://\S+$",
        description="Where Pyodide packages are fetched from, in the Pyodide CDN's layout "
        "(<url>/pyodide-lock.json, <url>/<file>); default: the CDN for the pinned Pyodide version. "
        "Pyodide's own lock file still decides the sha256 of every package it names.",
    )
    audit_log: Path | None = Field(
        None, description="JSON-lines file with one record per execution (mode 0600)."
    )
    save_code: Path | None = Field(
        None, description="Folder where each executed program is saved as a .py file."
    )
    # Not a command-line flag (hidden there, and refused): a secret on a command line shows in `ps`.
    auth_token: CliSuppress[SecretStr | None] = Field(
        None, min_length=16, description="HTTP/SSE: require Authorization: Bearer <token> on every request."
    )
    auth_tokens_file: Path | None = Field(
        None,
        description='HTTP/SSE: a JSON file {"<principal>": "<token>" or "sha256:<hex of its hash>"}, '
        "readable by its owner only, re-read when it changes. Each caller is the principal its bearer "
        "token names, and its sessions, kept outputs, output files and audit records are its own.",
    )
    auth_jwks: str | None = Field(
        None,
        description="HTTP/SSE: OAuth resource-server mode. JWT access tokens are checked against this JSON "
        "Web Key Set (a file, or an https:// URL fetched and cached), with MCP_SANDBOX_AUTH_ISSUER and "
        "MCP_SANDBOX_AUTH_RESOURCE_URL; the caller's principal is the token's sub.",
    )
    auth_issuer: str | None = Field(
        None,
        pattern=r"^https?://\S+$",
        description="With MCP_SANDBOX_AUTH_JWKS: the only accepted `iss`, and the authorization server "
        "the protected-resource metadata names.",
    )
    auth_resource_url: str | None = Field(
        None,
        pattern=r"^https?://\S+$",
        description="With MCP_SANDBOX_AUTH_JWKS: this server's public URL (https://sandbox.example/mcp). "
        "A token's `aud` must name it (RFC 8707), and /.well-known/oauth-protected-resource describes it.",
    )
    bridge_config: Path | None = Field(
        None,
        description='JSON file of upstream MCP servers ({"mcpServers": ...}, as Claude Desktop\'s) '
        "whose tools sandboxed code may call as tools.<server>.<tool>(...).",
    )
    bridge_call_timeout: float = Field(30.0, gt=0, description="Seconds one bridged tool call may take.")
    bridge_max_calls: int = Field(1000, ge=1, description="Bridged tool calls one execution may make.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Logs go to stderr at this level; stdout belongs to the stdio transport."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="serve: json writes each log line as a JSON object, with the session and call ids of "
        "the call that logged it.",
    )
    metrics: bool = Field(
        True,
        description="HTTP and SSE: serve Prometheus metrics at /metrics, without a token (docs/deploy.md).",
    )

    @field_validator(
        "deno_path",
        "cache_dir",
        "data_dir",
        "output_dir",
        "packages_dir",
        "audit_log",
        "save_code",
        "bridge_config",
        "state_dir",
    )
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        # Resolved once, so a later change of working directory cannot move them.
        return path.expanduser().absolute() if path is not None else None

    @field_validator("backend", mode="plain")
    @classmethod
    def _known_backend(cls, name: object) -> str:
        names = backend_names()
        if not isinstance(name, str) or name not in names:
            raise ValueError(f"{name!r} is not a backend; use one of {', '.join(names)}")
        return name

    @field_validator("default_packages")
    @classmethod
    def _package_names(cls, names: str) -> str:
        listed = [name.strip() for name in names.split(",") if name.strip()]
        bad = [name for name in listed if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name)]
        if bad:
            raise ValueError(f"not a package name: {', '.join(bad)} (give names like numpy,pandas)")
        return ",".join(listed)

    @field_validator("package_index_url")
    @classmethod
    def _folder_url(cls, url: str | None) -> str | None:
        # File names are appended to it.
        return url if url is None or url.endswith("/") else url + "/"

    @field_validator("data_dir")
    @classmethod
    def _existing_folder(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_dir():
            raise ValueError(f"{path} is not a folder")
        return path.resolve() if path is not None else None

    @model_validator(mode="after")
    def _one_state_location(self) -> Self:
        if self.state_url is None or self.redis_url is not None:
            if self.redis_url is not None and self.state_dir is not None:
                raise ValueError(
                    "MCP_SANDBOX_STATE_URL names Redis and MCP_SANDBOX_STATE_DIR a folder: set one of them"
                )
            return self
        parsed = urllib.parse.urlsplit(self.state_url)
        if parsed.scheme not in ("", "file"):
            raise ValueError(
                f"MCP_SANDBOX_STATE_URL {self.state_url!r}: use redis://, rediss://, file:// or a "
                "folder's path"
            )
        folder = Path(urllib.parse.unquote(parsed.path) if parsed.scheme else self.state_url).resolve()
        if self.state_dir is not None and self.state_dir != folder:
            raise ValueError(
                f"MCP_SANDBOX_STATE_URL ({folder}) and MCP_SANDBOX_STATE_DIR ({self.state_dir}) name two "
                "places for saved sessions: set one of them"
            )
        self.state_dir = folder
        return self

    @model_validator(mode="after")
    def _oauth_complete(self) -> Self:
        if self.auth_jwks is not None and (self.auth_issuer is None or self.auth_resource_url is None):
            raise ValueError(
                "MCP_SANDBOX_AUTH_JWKS needs MCP_SANDBOX_AUTH_ISSUER and MCP_SANDBOX_AUTH_RESOURCE_URL: "
                "a token is accepted only from that issuer, for this server"
            )
        return self

    @property
    def redis_url(self) -> str | None:
        """state_url when it names Redis, else None."""
        url = self.state_url
        return url if url is not None and url.startswith(("redis://", "rediss://")) else None

    @property
    def many_principals(self) -> bool:
        """Callers may be principals of their own: a tokens file or an OAuth issuer is set."""
        return self.auth_tokens_file is not None or self.auth_jwks is not None

    @property
    def packages_folder(self) -> Path:
        return self.packages_dir or self.cache_dir / "packages"

    @property
    def default_package_names(self) -> list[str]:
        return self.default_packages.split(",") if self.default_packages else []

    @property
    def preload_package_names(self) -> list[str] | None:
        """The packages to preload (None: the default packages that are present)."""
        if self.preload_packages is None:
            return None
        return [name.strip() for name in self.preload_packages.split(",") if name.strip()]

    def output_limits(self) -> OutputLimits:
        return {
            "max_files": self.max_output_files,
            "max_bytes": int(self.max_output_mb * 1024 * 1024),
            "max_figures": self.max_figures,
        }

    def clamp_timeout(self, requested: float | None) -> float:
        """The timeout a call really gets: the default when unset, never above the maximum."""
        return min(requested if requested is not None else self.timeout, self.max_timeout)


#: docs/settings.md holds the table `settings_table` makes between these lines.
TABLE_BEGIN = (
    "<!-- settings table: generated from mcp_sandbox/settings.py by `python docs/settings_table.py` -->"
)
TABLE_END = "<!-- end of the settings table -->"


def settings_table() -> str:
    """Every setting as a Markdown table: variable, flag, default, what it does (docs/settings.md)."""
    rows = ["| variable | flag | default | what it does |", "| --- | --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        flag = "none" if CLI_SUPPRESS in field.metadata else f"`--{name.replace('_', '-')}`"
        if field.default_factory is not None:
            default = (field.default_factory.__doc__ or "computed").strip()
        elif field.default is None:
            default = "unset"
        elif isinstance(field.default, bool):
            default = f"`{str(field.default).lower()}`"
        elif isinstance(field.default, float) and field.default.is_integer():
            default = f"`{int(field.default)}`"
        else:
            default = f"`{field.default}`"
        text = (field.description or "").replace("|", "\\|").replace("<", "\\<")
        choices = (
            [str(choice) for choice in get_args(field.annotation)]
            if get_origin(field.annotation) is Literal
            else []
        )
        if choices:
            text += f" One of {', '.join(f'`{choice}`' for choice in choices)}."
        rows.append(f"| `MCP_SANDBOX_{name.upper()}` | {flag} | {default} | {text} |")
    return "\n".join(rows) + "\n"


def with_settings_table(document: str) -> str:
    """`document` with the text between TABLE_BEGIN and TABLE_END replaced by the current table."""
    head, begin, rest = document.partition(TABLE_BEGIN)
    _, end, tail = rest.partition(TABLE_END)
    if not begin or not end:
        raise ValueError(f"the document lacks the lines {TABLE_BEGIN} and {TABLE_END}")
    return f"{head}{TABLE_BEGIN}\n{settings_table()}{TABLE_END}{tail}"
