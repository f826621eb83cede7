// A small Node.js client for the embeddb gRPC API, written from the .proto alone.
//
// What it shows: a client in another language learns everything it needs from the server.
// `connect()` calls DescribeShard on every address, checks that the list is complete and in
// shard order and that the shards route with the algorithm this file implements, and sizes its
// channels (grpc.max_receive_message_length / max_send_message_length) and its requests from
// the limits each shard reports, instead of guessing (grpc-js's default 4 MiB receive limit
// is what made an 80k x 16 lookup fail).
//
//   const embeddb = require('./embeddb');
//   const cluster = await embeddb.connect(['127.0.0.1:7070', '127.0.0.1:7071'], {token});
//   await cluster.assign('user_id', [7n, 42n], new Float32Array(2 * 16));
//   const vectors = await cluster.lookup('user_id', [7n, 42n, 7n]);  // Float32Array, 3 x dim
//   cluster.close();
//
// Ids are BigInt (uint64); vectors are row-major Float32Array. Tensors travel as raw
// little-endian bytes (see the Tensor comment of embeddb.proto).
'use strict';

const { execFileSync } = require('node:child_process');
const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const ROUTING_ALGORITHM = 'splitmix64-lemire-v1';
const SALT = 0x5d1ce0db5eed0001n;
const MASK64 = (1n << 64n) - 1n;
const SERVICE = 'EmbeddingStoreService';
// Bytes a request or response may need beyond its tensors' data (field tags, shape, table
// name): a generous allowance, so that a request sized to the limit never exceeds it.
const ENVELOPE_BYTES = 4096;

/** An error the client raises itself (not a gRPC status): a topology or argument problem. */
class EmbeddbClientError extends Error {
  constructor(message) {
    super(message);
    this.name = 'EmbeddbClientError';
  }
}

/** The directory holding embeddb/v1/embeddb.proto: `embeddb proto-path` of the installed package. */
function defaultProtoDir() {
  try {
    return execFileSync('embeddb', ['proto-path'], { encoding: 'utf8' }).trim();
  } catch (err) {
    throw new EmbeddbClientError(
      `could not run 'embeddb proto-path' (${err.message}); pass the proto directory instead`
    );
  }
}

/**
 * Load the embeddb.v1 package from `protoDir` (default: `embeddb proto-path`).
 * Returns the grpc package object: `pkg.embeddb.v1.EmbeddingStoreService` is the client class.
 */
function loadProto(protoDir) {
  const dir = protoDir || defaultProtoDir();
  const definition = protoLoader.loadSync('embeddb/v1/embeddb.proto', {
    includeDirs: [dir],
    keepCase: true, // field names as in the .proto (max_message_bytes, row_scales)
    longs: String, // 64-bit integers as decimal strings, converted to BigInt here
    enums: String, // enum values by name (D_TYPE_FLOAT32)
    defaults: true,
    oneofs: true,
  });
  return { pkg: grpc.loadPackageDefinition(definition), protoDir: dir };
}

/** The mixed hash h of a uint64 id (BigInt): SplitMix64's finaliser of id ^ salt. */
function mixHash(id) {
  let z = ((BigInt(id) ^ SALT) + 0x9e3779b97f4a7c15n) & MASK64;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return z ^ (z >> 31n);
}

/** The shard (a Number in [0, numShards)) of a uint64 id in a cluster of numShards shards. */
function shardOf(id, numShards) {
  return Number(((mixHash(id) >> 32n) * BigInt(numShards)) >> 32n);
}

// ------------------------------------------------------------------ tensors (little-endian)
const LITTLE_ENDIAN = os.endianness() === 'LE';

function idsTensor(ids) {
  const data = Buffer.alloc(ids.length * 8);
  if (LITTLE_ENDIAN) {
    new BigUint64Array(data.buffer, data.byteOffset, ids.length).set(ids);
  } else {
    ids.forEach((id, i) => data.writeBigUInt64LE(id, i * 8));
  }
  return { dtype: 'D_TYPE_UINT64', shape: [ids.length], data };
}

function float32Tensor(values, rows, dim) {
  const data = Buffer.alloc(values.length * 4);
  if (LITTLE_ENDIAN) {
    new Float32Array(data.buffer, data.byteOffset, values.length).set(values);
  } else {
    values.forEach((v, i) => data.writeFloatLE(v, i * 4));
  }
  return { dtype: 'D_TYPE_FLOAT32', shape: [rows, dim], data };
}

/** Float32 values of little-endian bytes (copied: a received Buffer may be unaligned). */
function readFloat32(buffer, count) {
  if (buffer.length !== count * 4) {
    throw new EmbeddbClientError(`expected ${count * 4} bytes of float32, got ${buffer.length}`);
  }
  const out = new Float32Array(count);
  if (LITTLE_ENDIAN) {
    new Uint8Array(out.buffer).set(buffer);
  } else {
    for (let i = 0; i < count; i++) out[i] = buffer.readFloatLE(i * 4);
  }
  return out;
}

let halfTable = null;

/** float32 value of every float16 bit pattern (65,536 entries, built once). */
function halfToFloatTable() {
  if (halfTable === null) {
    halfTable = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) {
      const sign = h & 0x8000 ? -1 : 1;
      const exponent = (h >> 10) & 0x1f;
      const fraction = h & 0x3ff;
      if (exponent === 0) halfTable[h] = sign * fraction * 2 ** -24;
      else if (exponent === 31) halfTable[h] = fraction ? NaN : sign * Infinity;
      else halfTable[h] = sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
    }
  }
  return halfTable;
}

/** The [rows x dim] float32 values of a response Tensor (FLOAT32, or FLOAT16 with row_scales). */
function decodeMatrix(tensor, rows, dim) {
  if (tensor.compression !== 'COMPRESSION_UNSPECIFIED') {
    throw new EmbeddbClientError(`unexpected ${tensor.compression} tensor (never requested)`);
  }
  const shape = tensor.shape.map(Number);
  if (shape.length !== 2 || shape[0] !== rows || shape[1] !== dim) {
    throw new EmbeddbClientError(`expected a [${rows}, ${dim}] tensor, got [${shape}]`);
  }
  if (tensor.dtype === 'D_TYPE_FLOAT32') return readFloat32(tensor.data, rows * dim);
  if (tensor.dtype !== 'D_TYPE_FLOAT16') {
    throw new EmbeddbClientError(`unexpected tensor dtype ${tensor.dtype}`);
  }
  // float16 values, each row multiplied by its scale before the cast: divide it back out.
  const table = halfToFloatTable();
  const scales = tensor.row_scales.length ? readFloat32(tensor.row_scales, rows) : null;
  const out = new Float32Array(rows * dim);
  for (let r = 0; r < rows; r++) {
    const scale = scales ? scales[r] : 1;
    for (let c = 0; c < dim; c++) {
      out[r * dim + c] = table[tensor.data.readUInt16LE((r * dim + c) * 2)] / scale;
    }
  }
  return out;
}

// ------------------------------------------------------------------ the cluster
function callUnary(client, method, request, metadata, label) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, (err, response) => {
      if (err) {
        const status = grpc.status[err.code] || String(err.code);
        const wrapped = new Error(`${method} to ${label} failed: ${status}: ${err.details}`);
        wrapped.code = err.code; // the gRPC status code (grpc.status.PERMISSION_DENIED ...)
        wrapped.status = status;
        wrapped.details = err.details;
        reject(wrapped);
      } else {
        resolve(response);
      }
    });
  });
}

function chunks(items, size) {
  const out = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}

/** The shards of one cluster, connected with channels sized to their limits. */
class Cluster {
  constructor(shards, metadata) {
    this.shards = shards; // [{address, client, limits: {max_message_bytes, ...} (Numbers)}]
    this.metadata = metadata;
    this.requests = 0; // data calls sent (Assign and Lookup)
    this.dims = new Map();
  }

  /** The largest limits.max_message_bytes over the shards. */
  get maxMessageBytes() {
    return Math.max(...this.shards.map((s) => s.limits.max_message_bytes));
  }

  /** The tables the cluster serves: [{name, dim, optimizer, state_dim, capacity}]. */
  async tables() {
    const shard = this.shards[0];
    const reply = await callUnary(
      shard.client, 'ListTables', {}, this.metadata, `shard 0 (${shard.address})`
    );
    for (const t of reply.tables) this.dims.set(t.name, t.dim);
    return reply.tables;
  }

  /** The dim of `table` (DescribeTable, asked once). */
  async dim(table) {
    if (!this.dims.has(table)) {
      const shard = this.shards[0];
      const info = await callUnary(
        shard.client, 'DescribeTable', { table }, this.metadata, `shard 0 (${shard.address})`
      );
      this.dims.set(table, info.dim);
    }
    return this.dims.get(table);
  }

  /** Ids a request to `shard` may carry for rows of `rowBytes` bytes each. */
  idsPerRequest(shard, rowBytes, response) {
    const { max_ids_per_request, max_message_bytes, max_response_bytes } = shard.limits;
    let n = Math.min(max_ids_per_request, Math.floor((max_message_bytes - ENVELOPE_BYTES) / (rowBytes + 8)));
    if (response) n = Math.min(n, Math.floor(max_response_bytes / rowBytes));
    if (n < 1) throw new EmbeddbClientError(`shard ${shard.address}: limits too small for one row`);
    return n;
  }

  /** Group positions 0..ids.length-1 by shard, keeping the last position of each distinct id. */
  route(ids) {
    const last = new Map();
    ids.forEach((id, i) => last.set(BigInt.asUintN(64, BigInt(id)), i));
    const byShard = this.shards.map(() => ({ ids: [], positions: [] }));
    for (const [id, position] of last) {
      const group = byShard[shardOf(id, this.shards.length)];
      group.ids.push(id);
      group.positions.push(position);
    }
    return byShard;
  }

  /** Write `vectors` (Float32Array, ids.length x dim) as the rows of `ids`; the last row of a
   * repeated id wins. Resolves to the number of rows written. */
  async assign(table, ids, vectors) {
    const dim = await this.dim(table);
    if (vectors.length !== ids.length * dim) {
      throw new EmbeddbClientError(`vectors must hold ${ids.length} x ${dim} values`);
    }
    const byShard = this.route(ids);
    const written = await Promise.all(
      byShard.map(async (group, k) => {
        const shard = this.shards[k];
        let total = 0;
        const per = this.idsPerRequest(shard, dim * 4, false);
        const idChunks = chunks(group.ids, per);
        const posChunks = chunks(group.positions, per);
        for (let c = 0; c < idChunks.length; c++) {
          const rows = new Float32Array(idChunks[c].length * dim);
          posChunks[c].forEach((p, r) => rows.set(vectors.subarray(p * dim, (p + 1) * dim), r * dim));
          this.requests += 1;
          const reply = await callUnary(
            shard.client,
            'Assign',
            { table, ids: idsTensor(idChunks[c]), vectors: float32Tensor(rows, idChunks[c].length, dim) },
            this.metadata,
            `shard ${k} (${shard.address})`
          );
          total += Number(reply.written);
        }
        return total;
      })
    );
    return written.reduce((a, b) => a + b, 0);
  }

  /** The vectors of `ids` (Float32Array, ids.length x dim, in request order). `train`: insert
   * missing rows and refresh recency (default false: evaluation); `fp16`: ask for scaled
   * float16 (lossy, half the bytes). */
  async lookup(table, ids, { train = false, fp16 = false } = {}) {
    const dim = await this.dim(table);
    const byShard = this.route(ids);
    const unique = new Map(); // id -> Float32Array row
    await Promise.all(
      byShard.map(async (group, k) => {
        const shard = this.shards[k];
        const per = this.idsPerRequest(shard, fp16 ? dim * 2 + 4 : dim * 4, true);
        for (const part of chunks(group.ids, per)) {
          this.requests += 1;
          const reply = await callUnary(
            shard.client,
            'Lookup',
            { table, ids: idsTensor(part), train, encoding: { fp16, lz4_min_bytes: 0 } },
            this.metadata,
            `shard ${k} (${shard.address})`
          );
          const rows = decodeMatrix(reply.vectors, part.length, dim);
          part.forEach((id, r) => unique.set(id, rows.subarray(r * dim, (r + 1) * dim)));
        }
      })
    );
    const out = new Float32Array(ids.length * dim);
    ids.forEach((id, i) => out.set(unique.get(BigInt.asUintN(64, BigInt(id))), i * dim));
    return out;
  }

  close() {
    for (const shard of this.shards) shard.client.close();
  }
}

/**
 * Connect to a cluster: `addresses[k]` must be shard k of addresses.length.
 *
 * Calls DescribeShard on every address and checks shard_index, num_shards and the routing
 * algorithm; then opens each shard's channel with its max_message_bytes as the send and
 * receive limit. Options: token (sent as `authorization: Bearer <token>`), protoDir (default:
 * `embeddb proto-path`), credentials (default: insecure; grpc.credentials.createSsl(...) for TLS).
 * Rejects with an EmbeddbClientError naming the topology problem, or with the gRPC status.
 */
async function connect(addresses, { token, protoDir, credentials } = {}) {
  if (!Array.isArray(addresses) || addresses.length === 0) {
    throw new EmbeddbClientError('connect() needs at least one address');
  }
  const { pkg } = loadProto(protoDir);
  const Service = pkg.embeddb.v1[SERVICE];
  const creds = credentials || grpc.credentials.createInsecure();
  const metadata = new grpc.Metadata();
  if (token) metadata.set('authorization', `Bearer ${token}`);

  const described = await Promise.all(
    addresses.map(async (address, k) => {
      const probe = new Service(address, creds); // DescribeShard's answer is small
      try {
        return await callUnary(probe, 'DescribeShard', {}, metadata, `${address} (position ${k})`);
      } finally {
        probe.close();
      }
    })
  );
  const problems = [];
  described.forEach((d, k) => {
    const where = `address ${addresses[k]} (position ${k} of ${addresses.length})`;
    if (d.num_shards !== addresses.length) {
      problems.push(`${where} is a shard of ${d.num_shards}, but ${addresses.length} addresses were given`);
    } else if (d.shard_index !== k) {
      problems.push(`${where} is shard ${d.shard_index}; list the addresses in shard order`);
    }
    if (d.routing.algorithm !== ROUTING_ALGORITHM || BigInt(d.routing.salt) !== SALT) {
      problems.push(
        `${where} routes with ${d.routing.algorithm} (salt ${d.routing.salt}); this client implements ${ROUTING_ALGORITHM}`
      );
    }
  });
  if (problems.length) {
    throw new EmbeddbClientError(`topology mismatch: ${problems.join('; ')}`);
  }

  const shards = described.map((d, k) => {
    const limits = {
      max_message_bytes: Number(d.limits.max_message_bytes),
      max_ids_per_request: Number(d.limits.max_ids_per_request),
      max_response_bytes: Number(d.limits.max_response_bytes),
    };
    const client = new Service(addresses[k], creds, {
      'grpc.max_receive_message_length': limits.max_message_bytes,
      'grpc.max_send_message_length': limits.max_message_bytes,
    });
    return { address: addresses[k], client, limits, follower: d.follower };
  });
  return new Cluster(shards, metadata);
}

module.exports = {
  Cluster,
  EmbeddbClientError,
  ROUTING_ALGORITHM,
  SALT,
  connect,
  decodeMatrix,
  defaultProtoDir,
  loadProto,
  mixHash,
  shardOf,
  routingVectorsFile: (dir) => path.join(dir, 'embeddb', 'v1', 'routing_test_vectors.json'),
};
