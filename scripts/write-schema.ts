/**
 * `npm run schema`: writes shardctl.schema.json, the JSON Schema of a config file, from the zod
 * schema (src/config/schema.ts). The file is committed and shipped in the package, so editors and
 * CI can point at it; test/unit/config-schema.test.ts fails when it differs from the schema.
 */
import { writeFileSync } from 'node:fs';
import { configJsonSchema } from '../src/config/schema.js';

writeFileSync(new URL('../shardctl.schema.json', import.meta.url), `${JSON.stringify(configJsonSchema(), null, 2)}\n`);
