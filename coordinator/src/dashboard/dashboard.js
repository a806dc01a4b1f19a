'use strict';
// The coordinator dashboard: polls this coordinator's /v1 API once a second and renders
// groups, members, the shard ownership grid, reshard progress and recent audit entries.
// Everything is built with DOM calls and textContent (never innerHTML with data).

const POLL_MS = 1000;
const TOKEN_KEY = 'rsc.viewerToken';

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  selected: selectedFromHash(),
  lastOk: 0,
};

function selectedFromHash() {
  const m = /(?:^|[#&])group=([^&]+)/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'style') node.setAttribute('style', v);
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(path) {
  const headers = { Accept: 'application/json' };
  if (state.token) headers.Authorization = 'Bearer ' + state.token;
  const resp = await fetch(path, { headers, cache: 'no-store', credentials: 'omit' });
  let body = null;
  try { body = await resp.json(); } catch (_) { body = null; }
  return { status: resp.status, ok: resp.ok, body };
}

function errorText(r) {
  const e = r && r.body && r.body.error;
  return e ? e.code + ': ' + e.message : 'HTTP ' + (r ? r.status : '?');
}

// Member colours: a categorical palette by position in the group (distinct at a glance),
// then a hue derived from the id for very large groups.
const PALETTE = [[214, 55, 46], [146, 50, 38], [268, 45, 55], [186, 70, 34], [28, 50, 40],
  [328, 50, 50], [70, 55, 35], [222, 50, 32], [160, 55, 30], [0, 0, 45]];
let colours = new Map();
function hue(id) {
  let h = 2166136261;
  for (let i = 0; i < id.length; i++) { h ^= id.charCodeAt(i); h = Math.imul(h, 16777619); }
  return ((h >>> 0) % 360);
}
function colourOf(id) {
  return colours.get(id) || [hue(id), 60, 42];
}
function strong(id) { const [h, s, l] = colourOf(id); return 'hsl(' + h + ', ' + s + '%, ' + l + '%)'; }
function tint(id) { const [h, s] = colourOf(id); return 'hsl(' + h + ', ' + Math.max(s, 30) + '%, 95%)'; }

function ago(ms) {
  if (ms < 1000) return ms + ' ms';
  if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
  if (ms < 3600000) return Math.floor(ms / 60000) + ' min ' + Math.floor(ms / 1000 % 60) + ' s';
  return Math.floor(ms / 3600000) + ' h ' + Math.floor(ms / 60000 % 60) + ' min';
}

function ranges(list) {
  const s = [...new Set(list || [])].sort((a, b) => a - b);
  const out = [];
  for (let i = 0; i < s.length; i++) {
    let j = i;
    while (j + 1 < s.length && s[j + 1] === s[j] + 1) j++;
    out.push(i === j ? String(s[i]) : s[i] + '–' + s[j]);
    i = j;
  }
  return out.length ? out.join(', ') : '–';
}

function plural(n, word) { return n + ' ' + word + (n === 1 ? '' : 's'); }
function badge(text) { return el('span', { class: 'badge ' + text }, text); }
function fact(label, value) { return el('span', { class: 'fact' }, label + ' ', el('b', {}, value)); }

function setStatus(kind, text) {
  const s = $('status');
  s.dataset.state = kind;
  s.textContent = text;
}

function setBanner(text, isError) {
  const b = $('banner');
  if (!text) { b.hidden = true; b.textContent = ''; return; }
  b.hidden = false;
  b.className = 'banner' + (isError ? ' error' : '');
  b.textContent = text;
}

function renderTokenState() {
  $('token-state').textContent = state.token ? 'token set for this tab' : 'no token';
}

// ---- groups -------------------------------------------------------------------------------

function renderGroups(groups) {
  $('group-count').textContent = '(' + groups.length + ')';
  const list = $('groups');
  if (!groups.length) {
    list.replaceChildren(el('li', { class: 'empty-note' }, 'No groups yet.'));
    return;
  }
  list.replaceChildren(...groups.map(g => el('li', {
    class: g.group === state.selected ? 'selected' : '',
    'data-group': g.group,
    onclick: () => { state.selected = g.group; location.hash = 'group=' + encodeURIComponent(g.group); poll(true); },
  },
  el('div', { class: 'name' }, el('span', {}, g.group), badge(g.state), g.paused ? badge('paused') : null),
  el('div', { class: 'sub' }, 'stream ' + g.stream + ' · ' + plural(g.members.length, 'member') + ' · ' + plural(g.shards.length, 'shard')))));
}

function renderGroup(g) {
  if (!g) {
    $('group-title').textContent = 'No group selected';
    $('group-facts').replaceChildren();
    $('reshard-note').replaceChildren();
    $('legend').replaceChildren();
    $('grid').replaceChildren(el('div', { class: 'empty-note' }, 'Create a group to see its shards here.'));
    $('members').replaceChildren();
    return;
  }
  $('group-title').replaceChildren('Group ', el('span', { class: 'mono', id: 'group-name' }, g.group), ' ', badge(g.state),
    ...(g.paused ? [' ', el('span', { class: 'badge paused', id: 'group-paused', title: 'paused by an operator since ' + new Date(g.paused_since_ms).toISOString() + ': members keep their shards and fetch nothing new' }, 'paused')] : []));
  $('group-facts').replaceChildren(
    fact('stream', g.stream),
    fact('group epoch', g.group_epoch),
    fact('assignment epoch', g.assignment_epoch),
    fact('start', g.start),
    fact('session', ago(g.session_timeout_ms)),
    fact('heartbeat', ago(g.heartbeat_interval_ms)),
    fact('max members', g.max_members == null ? '∞' : g.max_members),
    fact('assignor', g.assignor),
    ...timeLagFact(g),
    ...lastSeekFact(g),
  );
  const r = g.resharding;
  $('reshard-note').replaceChildren(r ? el('div', { class: 'note' },
    (r.rollback ? 'Rollback ' : 'Reshard ') + r.from + ' → ' + r.to + ' running: draining shards stay assigned until every group has drained them.') : '');
  renderGrid(g);
  renderMembers(g);
}

// Time lag (PROTOCOL §18): the largest of the shards' ages of the oldest undelivered entry.
function timeLagFact(g) {
  const lags = g.shards.map(s => s.time_lag_ms).filter(v => v != null);
  if (!lags.length) return [];
  const max = Math.max(...lags);
  return [el('span', { class: 'fact', id: 'group-time-lag', 'data-ms': max, title: 'age of the oldest entry not yet delivered, over the shards' },
    'time lag ', el('b', {}, ago(max)))];
}

// The group's last seek (PROTOCOL §18): when, to what, how many entries delivered again.
function lastSeekFact(g) {
  const s = g.last_seek;
  if (!s) return [];
  return [el('span', { class: 'fact', id: 'group-last-seek', title: 'moved by an operator at ' + new Date(s.at_ms).toISOString() + ' on shards ' + s.shards.join(',') },
    'last seek ', el('b', {}, s.to), ' (' + s.redelivered + ' again)')];
}

function renderGrid(g) {
  colours = new Map(g.members.slice(0, PALETTE.length).map((m, i) => [m.member_id, PALETTE[i]]));
  const revoking = new Map();
  for (const m of g.members) for (const s of m.pending_revocation || []) revoking.set(s, m.member_id);
  const cells = g.shards.map(s => {
    const owner = s.current_owner;
    const target = s.target_owner;
    const classes = ['cell'];
    if (!owner) classes.push('unassigned');
    if (s.state === 'draining') classes.push('draining');
    if (revoking.has(s.shard)) classes.push('revoking');
    else if (owner && target !== owner) classes.push('moving');
    const tags = [];
    if (revoking.has(s.shard)) tags.push(el('span', { class: 'tag rev' }, 'revoking'));
    if (s.state === 'draining') tags.push(el('span', { class: 'tag drn' }, 'draining'));
    const title = [s.key, 'current owner: ' + (owner || 'none'), 'target owner: ' + (target || 'none'), 'state: ' + s.state];
    if (revoking.has(s.shard)) title.push('pending revocation from ' + revoking.get(s.shard));
    if (s.lag != null) title.push('lag: ' + s.lag);
    if (s.pending != null) title.push('pending: ' + s.pending);
    if (s.time_lag_ms != null) title.push('time lag: ' + ago(s.time_lag_ms) + ' (age of the oldest entry not yet delivered)');
    if (s.last_delivered_id != null) title.push('last delivered: ' + s.last_delivered_id + (s.last_delivered_ms != null ? ' (' + new Date(s.last_delivered_ms).toISOString() + ')' : ''));
    if (s.oldest_pending_age_ms != null) title.push('oldest pending: ' + ago(s.oldest_pending_age_ms) + ' old');
    const style = owner ? '--cell-color:' + strong(owner) + ';--cell-bg:' + tint(owner) : null;
    let targetLine = null;
    if (target && target !== owner) targetLine = el('div', { class: 'tgt' }, '→ ' + target);
    else if (!target) targetLine = el('div', { class: 'tgt' }, 'no target');
    const metrics = [];
    if (s.lag != null) metrics.push('lag ' + s.lag);
    if (s.pending != null) metrics.push('pending ' + s.pending);
    if (s.time_lag_ms) metrics.push('behind ' + ago(s.time_lag_ms));
    return el('div', {
      class: classes.join(' '),
      style,
      title: title.join('\n'),
      'data-shard': s.shard,
      'data-owner': owner || '',
      'data-target': target || '',
      'data-state': s.state,
      'data-revoking': revoking.has(s.shard) ? 'true' : 'false',
      'data-time-lag-ms': s.time_lag_ms == null ? null : s.time_lag_ms,
    },
    el('div', { class: 'idx' }, el('span', { class: 'mono' }, '#' + s.shard), el('span', {}, ...tags)),
    el('div', { class: 'own' }, owner || 'unassigned'),
    targetLine,
    metrics.length ? el('div', { class: 'lag' }, metrics.join(' · ')) : null);
  });
  $('grid').replaceChildren(...cells);
  const legend = [];
  for (const m of g.members) {
    legend.push(el('span', {}, el('span', { class: 'sw', style: 'background:' + strong(m.member_id) }), m.member_id));
  }
  legend.push(el('span', {}, el('span', { class: 'sw moving' }), 'moving (→ target)'));
  legend.push(el('span', {}, el('span', { class: 'sw revoking' }), 'pending revocation'));
  legend.push(el('span', {}, el('span', { class: 'sw draining' }), 'draining'));
  legend.push(el('span', {}, el('span', { class: 'sw unassigned' }), 'unassigned'));
  $('legend').replaceChildren(...legend);
}

function renderMembers(g) {
  if (!g.members.length) {
    $('members').replaceChildren(el('div', { class: 'empty-note' }, 'No members: the group is empty.'));
    return;
  }
  const rows = g.members.map(m => {
    const c = m.client || {};
    const client = [c.host, c.pod_ip].filter(Boolean).join(' / ') || '–';
    return el('tr', { 'data-member': m.member_id },
      el('td', {}, el('span', { class: 'dot', style: 'background:' + strong(m.member_id) }), el('span', { class: 'mono' }, m.member_id)),
      el('td', { class: 'num' }, m.member_epoch),
      el('td', {}, badge(m.state)),
      el('td', { class: 'mono' }, ranges(m.assigned_shards)),
      el('td', { class: 'mono' }, ranges(m.target_shards)),
      el('td', { class: 'mono' }, ranges(m.pending_revocation)),
      el('td', { class: 'num' }, ago(m.last_heartbeat_ms_ago) + ' ago'),
      el('td', {}, client));
  });
  $('members').replaceChildren(el('div', { class: 'scroll' }, el('table', {},
    el('thead', {}, el('tr', {}, ...['member', 'epoch', 'state', 'assigned', 'target', 'pending revocation', 'last heartbeat', 'client'].map(h => el('th', {}, h)))),
    el('tbody', {}, ...rows))));
}

// ---- lag over time ------------------------------------------------------------------------

// The SVG namespace, taken from an <svg> the HTML parser made (static markup, no data).
const SVG_NS = (() => { const t = document.createElement('template'); t.innerHTML = '<svg></svg>'; return t.content.firstChild.namespaceURI; })();
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(n) {
  if (n >= 1e6) return (n / 1e6).toFixed(1) + 'M';
  if (n >= 1e3) return (n / 1e3).toFixed(1) + 'k';
  return String(Math.round(n * 10) / 10);
}

// Lag (left scale) and handled/s (right scale) of the selected group from
// GET /v1/groups/{group}/history: two polylines, no library.
function renderChart(h) {
  const box = $('chart');
  const samples = (h && h.samples) || [];
  if (!samples.length) {
    box.replaceChildren(el('div', { class: 'empty-note', id: 'chart-empty' },
      h ? 'No samples yet (the coordinator samples lag from its data Redis every ' + ago(h.interval_ms) + ').' : 'History unavailable.'));
    return;
  }
  const W = 600, H = 160, L = 44, R = 44, T = 8, B = 18;
  const t0 = samples[0].t_ms, t1 = Math.max(samples[samples.length - 1].t_ms, t0 + 1);
  const maxLag = Math.max(1, ...samples.map(s => s.lag || 0));
  const maxRate = Math.max(1, ...samples.map(s => s.handled_per_s || 0));
  const x = t => L + (W - L - R) * (t - t0) / (t1 - t0);
  const y = (v, max) => T + (H - T - B) * (1 - v / max);
  const line = (key, max) => samples.filter(s => s[key] != null)
    .map(s => x(s.t_ms).toFixed(1) + ',' + y(s[key], max).toFixed(1)).join(' ');
  const last = samples[samples.length - 1];
  const chart = svg('svg', {
    id: 'lag-chart', viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none', role: 'img',
    'aria-label': 'lag and handled per second over the last ' + ago(t1 - t0),
    'data-samples': samples.length,
    'data-points': JSON.stringify(samples.map(s => [s.t_ms, s.lag, s.handled_per_s])),
  });
  chart.append(
    svg('line', { class: 'axis', x1: L, y1: H - B, x2: W - R, y2: H - B }),
    svg('line', { class: 'axis', x1: L, y1: T, x2: L, y2: H - B }),
    svg('line', { class: 'axis', x1: W - R, y1: T, x2: W - R, y2: H - B }),
    svg('text', { x: L - 4, y: T + 10, 'text-anchor': 'end' }, fmt(maxLag)),
    svg('text', { x: L - 4, y: H - B, 'text-anchor': 'end' }, '0'),
    svg('text', { x: W - R + 4, y: T + 10 }, fmt(maxRate) + '/s'),
    svg('text', { x: L, y: H - 4 }, '−' + ago(t1 - t0)),
    svg('text', { x: W - R, y: H - 4, 'text-anchor': 'end' }, 'now'),
    svg('polyline', { class: 'lagpath', points: line('lag', maxLag) }),
    svg('polyline', { class: 'ratepath', points: line('handled_per_s', maxRate) }),
  );
  box.replaceChildren(chart, el('div', { class: 'muted', id: 'chart-now' },
    'now: lag ' + (last.lag == null ? '–' : last.lag) + ' · pending ' + (last.pending == null ? '–' : last.pending) +
    ' · handled ' + (last.handled_per_s == null ? '–' : fmt(last.handled_per_s) + '/s')));
}

// ---- streams and resharding ---------------------------------------------------------------

function reshardBlock(s, r) {
  const left = (r.draining || []).length;
  const total = Math.max(r.from - r.to, left, 0);
  const done = total - left;
  const pct = r.state === 'complete' ? 100 : (total ? Math.round(100 * done / total) : 0);
  const kind = r.rollback ? 'rollback' : 'reshard';
  const waiting = [];
  for (const d of r.draining || []) {
    waiting.push(el('div', { class: 'muted' }, el('span', { class: 'mono' }, s.stream + ':' + d.shard),
      ' waiting for ' + (d.waiting_groups.join(', ') || '–') + (d.drained_groups.length ? ' · drained by ' + d.drained_groups.join(', ') : '')));
  }
  let window = null;
  if (r.state === 'complete' && s.rollback_until_ms != null) {
    window = s.rollback_until_ms > Date.now()
      ? 'rollback allowed until ' + clock(new Date(s.rollback_until_ms))
      : 'rollback window closed';
  }
  return el('div', { class: 'reshard', 'data-stream': s.stream },
    el('div', { class: 'line' },
      el('span', {}, el('b', {}, s.stream), ' ' + kind + ' ' + r.from + ' → ' + r.to),
      badge(r.state)),
    el('div', { class: 'bar' + (r.state === 'complete' ? ' done' : '') }, el('span', { style: 'width:' + pct + '%' })),
    el('div', { class: 'muted' }, total ? done + ' of ' + total + ' draining shards retired' : 'no shard to drain', window ? ' · ' + window : ''),
    ...waiting);
}

// A retention policy (PROTOCOL §18) in a few words; `acked`: show keep-acked (shard keys).
function policyText(p, acked) {
  if (!p) return '–';
  const parts = [];
  if (acked) parts.push('keep acked ' + (p.keep_acked_ms ? ago(p.keep_acked_ms) : '0'));
  if (p.max_age_ms != null) parts.push('max age ' + ago(p.max_age_ms));
  if (p.max_entries_per_shard != null) parts.push('max ' + p.max_entries_per_shard + '/shard');
  return parts.join(' · ') || 'no cap';
}

function renderStreams(streams) {
  if (!streams.length) {
    $('streams').replaceChildren(el('div', { class: 'empty-note' }, 'No streams yet.'));
    return;
  }
  const table = el('table', {},
    el('thead', {}, el('tr', {}, ...['stream', 'shards', 'routing epoch', 'groups', 'retention', 'dead letters', 'held back by'].map(h => el('th', {}, h)))),
    el('tbody', {}, ...streams.map(s => el('tr', { 'data-stream-row': s.stream, 'data-blocked-by': s.retention_blocked_by || '' },
      el('td', { class: 'mono' }, s.stream),
      el('td', { class: 'num' }, s.shard_count),
      el('td', { class: 'num' }, s.routing_epoch),
      el('td', {}, s.groups.join(', ') || '–'),
      el('td', { class: 'retention', 'data-keep-acked-ms': s.retention ? s.retention.keep_acked_ms : null }, policyText(s.retention, true)),
      el('td', { class: 'retention' }, policyText(s.dlq_retention, false)),
      el('td', { class: 'mono', title: s.detailed ? 'the group whose position holds retention back the most, when older than keep-acked' : 'shown for the selected group\'s stream' },
        s.retention_blocked_by ? badge('blocked') : '', s.retention_blocked_by ? ' ' + s.retention_blocked_by : (s.detailed ? 'none' : '–'))))));
  const blocks = streams.filter(s => s.resharding || s.last_reshard).map(s => reshardBlock(s, s.resharding || s.last_reshard));
  $('streams').replaceChildren(table, blocks.length ? el('h3', {}, 'Resharding') : '', ...blocks);
}

// ---- audit --------------------------------------------------------------------------------

function pick(o, keys) {
  for (const k of keys) if (o && o[k] !== undefined && o[k] !== null) return o[k];
  return undefined;
}

function show(v) {
  if (v === undefined || v === null) return '–';
  if (typeof v !== 'object') return String(v);
  const parts = Object.entries(v).filter(([, x]) => x !== null && typeof x !== 'object').map(([k, x]) => k + '=' + x);
  return parts.join(' ') || JSON.stringify(v);
}

function clock(d) { return d.toLocaleTimeString([], { hour12: false }); }

function when(v) {
  if (typeof v === 'number') return clock(new Date(v));
  if (typeof v === 'string' && !isNaN(Date.parse(v))) return clock(new Date(v));
  return show(v);
}

function renderAudit(r) {
  const box = $('audit');
  if (!r || r.status === 404 || r.status === 405) {
    box.replaceChildren(el('div', { class: 'empty-note', id: 'audit-unavailable' }, 'audit unavailable on this coordinator'));
    return;
  }
  if (!r.ok) {
    box.replaceChildren(el('div', { class: 'empty-note' }, 'audit unavailable: ' + errorText(r)));
    return;
  }
  const b = r.body;
  const entries = Array.isArray(b) ? b : (b && (b.entries || b.audit || b.items || b.records)) || [];
  if (!entries.length) {
    box.replaceChildren(el('div', { class: 'empty-note' }, 'No audit entries yet.'));
    return;
  }
  const rows = entries.slice(0, 20).map(e => {
    const result = pick(e, ['result', 'outcome', 'status']);
    const resultText = typeof result === 'object' && result !== null
      ? show(pick(result, ['code', 'status', 'outcome']) ?? result) : show(result);
    const refused = /^(4|5)\d\d|refused|denied|error|forbidden|unauth|rate/i.test(resultText);
    // A refusal entry stands for `count` refused requests alike (PROTOCOL §7).
    const times = typeof e.count === 'number' && e.count > 1 ? ' ×' + e.count : '';
    // Each cell ends in an ellipsis when it is too long; its full text is its title.
    const cell = (cls, text, title) => el('td', { class: cls, title: title || text }, text);
    const resultCell = el('td', { title: resultText + times },
      el('span', { class: 'badge ' + (refused ? 'refused' : 'stable') }, resultText + times));
    return el('tr', {},
      cell('num', when(pick(e, ['time_ms', 'ts_ms', 'timestamp_ms', 'at_ms', 'time', 'timestamp', 'at']))),
      cell('', show(pick(e, ['principal', 'who', 'actor'])), e.client_addr ? show(pick(e, ['principal', 'who', 'actor'])) + ' from ' + e.client_addr : ''),
      cell('mono', show(pick(e, ['action', 'operation', 'op']))),
      cell('mono', show(pick(e, ['target', 'resource', 'group', 'stream']))),
      resultCell);
  });
  const widths = ['16%', '22%', '22%', '22%', '18%'];
  box.replaceChildren(el('table', { class: 'fixed', id: 'audit-table' },
    el('colgroup', {}, ...widths.map(w => el('col', { style: 'width:' + w }))),
    el('thead', {}, el('tr', {}, ...['time', 'principal', 'action', 'target', 'result'].map(h => el('th', {}, h)))),
    el('tbody', {}, ...rows)));
}

// ---- dead letters ---------------------------------------------------------------------------

// The selected group's stream's dead letters (PROTOCOL §18): the depth of every group of the
// stream (the selected one first) and the selected group's latest errors.
function renderDlq(r, group, stream) {
  const box = $('dlq');
  $('dlq-stream').textContent = stream ? stream + ':dlq' : '';
  if (!group || !stream) { box.replaceChildren(); return; }
  if (!r || !r.ok) {
    const why = r && r.status === 400 ? 'the coordinator has no data Redis' : (r ? errorText(r) : 'no answer');
    box.replaceChildren(el('div', { class: 'empty-note', id: 'dlq-unavailable' }, 'dead letters unavailable: ' + why));
    return;
  }
  const b = r.body;
  const depth = (b.depth || []).slice().sort((x, y) => (y.group === group) - (x.group === group) || y.entries - x.entries);
  const now = Date.now();
  const depthTable = depth.length
    ? el('table', { id: 'dlq-depth' },
      el('thead', {}, el('tr', {}, ...['group', 'dead letters', 'oldest'].map(h => el('th', {}, h)))),
      el('tbody', {}, ...depth.map(d => el('tr', { 'data-dlq-group': d.group, 'data-entries': d.entries, class: d.group === group ? 'selected' : '' },
        el('td', { class: 'mono' }, d.group),
        el('td', { class: 'num' }, d.entries),
        el('td', { class: 'num' }, d.oldest_ms != null ? ago(Math.max(0, now - d.oldest_ms)) + ' ago' : '–')))))
    : el('div', { class: 'empty-note', id: 'dlq-empty' }, 'No dead letters in ' + stream + ':dlq.');
  const latest = b.entries || [];
  const parts = [depthTable];
  if (latest.length) {
    const ms = id => Number(String(id).split('-')[0]);
    parts.push(el('table', { class: 'fixed', id: 'dlq-latest' },
      el('colgroup', {}, ...['18%', '18%', '10%', '54%'].map(w => el('col', { style: 'width:' + w }))),
      el('thead', {}, el('tr', {}, ...['latest errors of ' + group, 'key', 'attempts', 'error'].map(h => el('th', { title: h }, h)))),
      el('tbody', {}, ...latest.map(e => el('tr', { 'data-dlq-id': e.dlq_id },
        el('td', { class: 'num', title: e.dlq_id }, clock(new Date(ms(e.dlq_id)))),
        el('td', { class: 'mono', title: e.key || '' }, e.key || '–'),
        el('td', { class: 'num' }, e.attempts != null ? e.attempts : '–'),
        el('td', { title: e.error }, e.error))))));
  }
  box.replaceChildren(...parts);
}

// ---- polling ------------------------------------------------------------------------------

let timer = null;
let inFlight = false;

async function poll(now) {
  if (now && timer) { clearTimeout(timer); timer = null; }
  if (inFlight) return;
  inFlight = true;
  try {
    const [groups, streams] = await Promise.all([api('/v1/groups'), api('/v1/streams')]);
    if (groups.status === 401 || groups.status === 403) {
      setStatus('error', groups.status === 401 ? 'token needed' : 'forbidden');
      setBanner(groups.status === 401
        ? 'This coordinator needs a viewer token: enter it above (it is kept for this tab only).'
        : 'The token is not allowed to read groups (' + errorText(groups) + ').', true);
      return;
    }
    if (!groups.ok || !streams.ok) throw new Error(errorText(groups.ok ? streams : groups));
    const list = groups.body.groups || [];
    if (!state.selected || !list.some(g => g.group === state.selected)) {
      state.selected = list.length ? list[0].group : null;
    }
    const sel = state.selected ? encodeURIComponent(state.selected) : null;
    const selStream = (list.find(g => g.group === state.selected) || {}).stream;
    // The stream view names the group holding retention back (PROTOCOL §18) only when
    // asked for one stream: the selected group's.
    const [detail, audit, history, streamDetail, dlq] = await Promise.all([
      sel ? api('/v1/groups/' + sel) : Promise.resolve(null),
      api('/v1/audit?limit=20').catch(() => null),
      sel ? api('/v1/groups/' + sel + '/history').catch(() => null) : Promise.resolve(null),
      selStream ? api('/v1/streams/' + encodeURIComponent(selStream)).catch(() => null) : Promise.resolve(null),
      selStream ? api('/v1/streams/' + encodeURIComponent(selStream) + '/dlq?newest_first=true&count=5&group=' + sel).catch(() => null) : Promise.resolve(null),
    ]);
    renderGroups(list);
    renderGroup(detail && detail.ok ? detail.body : (list.find(g => g.group === state.selected) || null));
    renderChart(history && history.ok ? history.body : null);
    renderStreams((streams.body.streams || []).map(s =>
      streamDetail && streamDetail.ok && streamDetail.body.stream === s.stream ? Object.assign({ detailed: true }, streamDetail.body) : s));
    renderAudit(audit);
    renderDlq(dlq, state.selected, selStream);
    state.lastOk = Date.now();
    setBanner('');
    setStatus('live', 'live · ' + clock(new Date()));
    document.body.dataset.loaded = 'true';
  } catch (e) {
    setStatus('error', 'coordinator unreachable');
    setBanner('Cannot load data: ' + (e && e.message ? e.message : e) +
      (state.lastOk ? ' (last good update ' + ago(Date.now() - state.lastOk) + ' ago)' : ''), true);
  } finally {
    inFlight = false;
    timer = setTimeout(poll, POLL_MS);
  }
}

$('token-form').addEventListener('submit', ev => {
  ev.preventDefault();
  state.token = $('token-input').value.trim();
  if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token); else sessionStorage.removeItem(TOKEN_KEY);
  $('token-input').value = '';
  renderTokenState();
  poll(true);
});
$('token-forget').addEventListener('click', () => {
  state.token = '';
  sessionStorage.removeItem(TOKEN_KEY);
  renderTokenState();
  poll(true);
});
window.addEventListener('hashchange', () => { state.selected = selectedFromHash(); poll(true); });

renderTokenState();
poll(true);
