// Log lines into the host's log, tagged with the plugin's digest
// (`sluice:plugin/log`). The host keeps at most 200 lines of 4 KiB per
// call and 1,000 per second per instance; more are counted as dropped.

import { host } from './host.js';

/** Log at TRACE. */
export const trace = (message) => host().log('trace', String(message));
/** Log at DEBUG. */
export const debug = (message) => host().log('debug', String(message));
/** Log at INFO. */
export const info = (message) => host().log('info', String(message));
/** Log at WARN. */
export const warn = (message) => host().log('warn', String(message));
/** Log at ERROR. */
export const error = (message) => host().log('error', String(message));
