// A sample application behind rsc-bridge, in Node 20 with the `http` module only
// (docs/BRIDGE.md). It receives stream entries as CloudEvents (binary or structured mode, or
// a batch), records each one it handled as a JSON line appended to APP_RECORD, and publishes
// through the bridge.
//
// Environment:
//   APP_PORT       port to listen on (127.0.0.1), or APP_SOCKET a Unix socket path
//   APP_RECORD     file to append one JSON line per handled entry (before answering 2xx):
//                  {entry_id, shard, key, seq, delivery_count, attempt, started_ms, finished_ms, app, mode}
//                  (mode: how the entry came, "binary", "structured" or "batch")
//   APP_HANDLE_MS  time each delivery takes (a slow application), default 0
//   APP_TOKEN      the bearer token shared with the bridge (checked on deliveries, sent on publish)
//   BRIDGE_URL     the bridge (default http://127.0.0.1:3500), for publishing
//
// Payloads are JSON objects. {"poison": true} is refused with 400 (the bridge dead-letters it);
// {"forward_to": "S"} is published to stream S through the bridge (same key, payload
// {"from": <entry id>, "seq": <seq>}) before the entry is acknowledged; a failed publish
// answers 503, so the bridge delivers the entry again later.
'use strict';
const http = require('http');
const fs = require('fs');

const record = process.env.APP_RECORD;
const handleMs = Number(process.env.APP_HANDLE_MS || 0);
const token = process.env.APP_TOKEN || '';
const bridge = process.env.BRIDGE_URL || 'http://127.0.0.1:3500';

function decodeCe(v) {
  return v === undefined ? null : decodeURIComponent(v);
}

function publish(stream, rec) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify(rec);
    const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) };
    if (token) headers.authorization = 'Bearer ' + token;
    const req = http.request(bridge + '/v1/publish/' + encodeURIComponent(stream), { method: 'POST', headers }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => (res.statusCode === 200 ? resolve(JSON.parse(text)) : reject(new Error(res.statusCode + ' ' + text))));
    });
    req.on('error', reject);
    req.end(body);
  });
}

// One event: {id, shard, key, deliveryCount, attempt, data, mode}. Returns an HTTP status.
async function handle(ev, started) {
  const data = ev.data || {};
  if (data.poison) return 400;
  if (handleMs > 0) await new Promise((r) => setTimeout(r, handleMs));
  if (data.forward_to) {
    try {
      await publish(data.forward_to, { key: ev.key, payload: { from: ev.id, seq: data.seq } });
    } catch (e) {
      console.error('publish failed: ' + e.message);
      return 503;
    }
  }
  if (record) {
    const line = {
      entry_id: ev.id, shard: ev.shard, key: ev.key, seq: data.seq, delivery_count: ev.deliveryCount,
      attempt: ev.attempt, started_ms: started, finished_ms: Date.now(), app: 'node', mode: ev.mode,
    };
    fs.appendFileSync(record, JSON.stringify(line) + '\n');
  }
  return 200;
}

function fromStructured(o, mode) {
  let data = o.data;
  if (data === undefined && o.data_base64 !== undefined) {
    try { data = JSON.parse(Buffer.from(o.data_base64, 'base64').toString()); } catch (_) { data = {}; }
  }
  return { id: o.id, shard: Number(o.rscshard), key: o.subject || null, deliveryCount: Number(o.rscdeliverycount),
    attempt: Number(o.rscattempt), data, mode };
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', async () => {
    const started = Date.now();
    if (token && req.headers.authorization !== 'Bearer ' + token) {
      res.writeHead(401).end();
      return;
    }
    const body = Buffer.concat(chunks).toString();
    const type = (req.headers['content-type'] || '').split(';')[0].trim();
    try {
      if (type === 'application/cloudevents-batch+json') {
        const failed = [];
        for (const o of JSON.parse(body)) {
          const status = await handle(fromStructured(o, 'batch'), started);
          if (status !== 200) failed.push({ id: o.id, status });
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ failed }));
        return;
      }
      let ev;
      if (type === 'application/cloudevents+json') {
        ev = fromStructured(JSON.parse(body), 'structured');
      } else {
        let data = {};
        try { data = JSON.parse(body); } catch (_) { res.writeHead(400).end(); return; }
        ev = { id: req.headers['ce-id'], shard: Number(req.headers['ce-rscshard']), key: decodeCe(req.headers['ce-subject']),
          deliveryCount: Number(req.headers['ce-rscdeliverycount']), attempt: Number(req.headers['ce-rscattempt']), data, mode: 'binary' };
      }
      res.writeHead(await handle(ev, started)).end();
    } catch (e) {
      console.error('delivery failed: ' + e.stack);
      res.writeHead(500).end();
    }
  });
});

const socket = process.env.APP_SOCKET;
if (socket) {
  if (fs.existsSync(socket)) fs.unlinkSync(socket);
  server.listen(socket, () => console.log('listening on ' + socket));
} else {
  server.listen(Number(process.env.APP_PORT || 8080), '127.0.0.1', () => console.log('listening on ' + server.address().port));
}
process.on('SIGTERM', () => server.close(() => process.exit(0)));
