#!/usr/bin/env node
// Round trip against a running embeddb cluster with the Node client of embeddb.js:
//
//   node example.js --addresses 127.0.0.1:7070,127.0.0.1:7071 [--token-file F] [--table T]
//                   [--rows N] [--proto-path DIR] [--dump F]
//
// --addresses as in every embeddb command: HOST:PORT,HOST:PORT in shard order (repeatable), or
// @FILE, a cluster address file (HOST:PORT lines, # comments). --address (repeated) still works,
// deprecated.
//
// 1. verifies every routing test vector (routing_test_vectors.json next to the .proto);
// 2. connects (DescribeShard on every address: topology checked, limits learned);
// 3. assigns N rows of random ids and vectors, looks them up (train=false) and checks that
//    they come back bit for bit (--table: default the first table ListTables names);
// 4. prints one JSON line: {"routing_vectors", "rows", "requests", "max_message_bytes", "ok"}.
// --dump F writes the ids (decimal strings) and the looked-up vectors (base64 of little-endian
// float32, row-major) as JSON, for a cross-language check. Exit 1 on any mismatch or error.
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const { parseArgs } = require('node:util');
const embeddb = require('./embeddb');

function verifyRoutingVectors(protoDir) {
  const file = embeddb.routingVectorsFile(protoDir);
  const spec = JSON.parse(fs.readFileSync(file, 'utf8'));
  if (spec.algorithm !== embeddb.ROUTING_ALGORITHM || BigInt(spec.salt) !== embeddb.SALT) {
    throw new Error(`${file}: algorithm ${spec.algorithm}, salt ${spec.salt}: not implemented here`);
  }
  for (const v of spec.vectors) {
    const id = BigInt(v.id);
    if (embeddb.mixHash(id) !== BigInt(v.hash)) {
      throw new Error(`routing vector ${v.id}: hash 0x${embeddb.mixHash(id).toString(16)}, expected ${v.hash}`);
    }
    v.shards.forEach((want, i) => {
      const got = embeddb.shardOf(id, i + 1);
      if (got !== want) throw new Error(`routing vector ${v.id}: shard ${got} of ${i + 1}, expected ${want}`);
    });
  }
  return spec.vectors.length;
}

/** `n` distinct random uint64 ids (BigInt). */
function randomIds(n) {
  const ids = new Set();
  while (ids.size < n) {
    const words = new BigUint64Array(crypto.randomBytes((n - ids.size) * 8).buffer);
    for (const id of words) ids.add(id);
  }
  return [...ids].slice(0, n);
}

function randomVectors(count) {
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = Math.random() * 2 - 1;
  return out;
}

/** The HOST:PORT lines of a cluster address file (blank lines and # comments skipped). */
function readAddressFile(file) {
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .map((line) => line.split('#', 1)[0].trim())
    .filter(Boolean);
}

/** The shards' addresses, in shard order, from --addresses (and the deprecated --address). */
function shardAddresses(values) {
  const out = [];
  for (const value of values.addresses || []) {
    if (value.startsWith('@')) out.push(...readAddressFile(value.slice(1)));
    else out.push(...value.split(',').map((a) => a.trim()).filter(Boolean));
  }
  if (values.address && values.address.length) {
    console.error(
      'Warning: --address is deprecated and will be removed in the next release; use --addresses HOST:PORT,...'
    );
    out.push(...values.address);
  }
  return out;
}

async function main() {
  const { values } = parseArgs({
    options: {
      addresses: { type: 'string', multiple: true },
      address: { type: 'string', multiple: true },
      'token-file': { type: 'string' },
      table: { type: 'string' },
      rows: { type: 'string', default: '10000' },
      'proto-path': { type: 'string' },
      dump: { type: 'string' },
    },
  });
  const addresses = shardAddresses(values);
  if (addresses.length === 0) {
    throw new Error('give --addresses HOST:PORT,... or --addresses @FILE (every shard, in shard order)');
  }
  const rows = Number(values.rows);
  if (!Number.isInteger(rows) || rows < 1) throw new Error(`--rows must be a positive integer, got ${values.rows}`);
  const token = values['token-file'] ? fs.readFileSync(values['token-file'], 'utf8').trim() : undefined;
  const protoDir = values['proto-path'] || embeddb.defaultProtoDir();

  const routingVectors = verifyRoutingVectors(protoDir);
  const cluster = await embeddb.connect(addresses, { token, protoDir });
  try {
    const table = values.table || (await cluster.tables())[0].name;
    const dim = await cluster.dim(table);
    const ids = randomIds(rows);
    const vectors = randomVectors(rows * dim);
    await cluster.assign(table, ids, vectors);
    const got = await cluster.lookup(table, ids, { train: false });
    const want = new Uint32Array(vectors.buffer);
    const have = new Uint32Array(got.buffer, got.byteOffset, got.length);
    let mismatches = 0;
    for (let i = 0; i < want.length; i++) if (want[i] !== have[i]) mismatches += 1;
    if (values.dump) {
      const bytes = Buffer.from(got.buffer, got.byteOffset, got.byteLength);
      const dump = { table, dim, ids: ids.map(String), vectors_f32le_base64: bytes.toString('base64') };
      fs.writeFileSync(values.dump, JSON.stringify(dump));
    }
    const summary = {
      routing_vectors: routingVectors,
      rows,
      requests: cluster.requests,
      max_message_bytes: cluster.maxMessageBytes,
      ok: mismatches === 0,
    };
    if (mismatches) summary.mismatched_values = mismatches;
    console.log(JSON.stringify(summary));
    return mismatches === 0 ? 0 : 1;
  } finally {
    cluster.close();
  }
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`error: ${err.message}`);
    process.exit(1);
  }
);
