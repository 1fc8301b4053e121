// First of the app's imports, so it runs before any zod schema is built or parsed: zod never
// probes for `new Function`, which the app's CSP forbids and reports as a violation even when
// the probe's error is caught. (App sets this too, but only once constructed: too late for
// schemas the MCP SDK parses as it loads.)
import { config } from "zod/v4/core";

config({ jitless: true });
