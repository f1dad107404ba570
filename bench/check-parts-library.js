// What bench/check-parts.js calls, in one module: bundled, it loads as one chunk, as the CLI's
// library does.
export { loadConfig, readMigrations } from '../dist/index.js';
export { Fleet } from '../dist/fleet/session.js';
export { readHostSnapshot } from '../dist/fleet/catalog.js';
export { findConflicts, planFleet } from '../dist/provisioning/plan.js';
