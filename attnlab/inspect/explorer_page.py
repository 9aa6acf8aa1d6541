"""The explorer page: HTML, CSS and JavaScript in one string, with no external resource. The
data goes in place of __DATA__ (see :func:`attnlab.inspect.explorer.write_page`).

Views draw on canvases; a head's weights are decoded from base64 the first time it is shown.
The element ``#status`` mirrors what is selected (data-layer, data-head, data-query, data-top:
the most attended positions, best first) so that tests and scripts can read the page's state.
"""

TEMPLATE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 12px;z-index:2;display:flex;gap:12px;align-items:center;flex-wrap:wrap}
h1{font-size:16px;margin:0 12px 0 0}
main{display:flex;gap:16px;padding:12px;align-items:flex-start;flex-wrap:wrap}
.panel{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
.panel h2{font-size:13px;margin:0 0 6px 0;color:#555}
#thumbs{display:grid;gap:4px}
#thumbs canvas{border:2px solid transparent;cursor:pointer;image-rendering:pixelated}
#thumbs canvas.sel{border-color:#d33}
#values{font:12px monospace;white-space:pre;max-height:320px;overflow:auto;margin:0}
#next td{padding:1px 6px}
.hint{color:#777;font-size:12px}
button,select{font:inherit}
</style></head>
<body>
<header><h1>__TITLE__</h1>
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
<span id="extra"></span>
<button id="save-png">Save PNG</button><button id="save-json">Save JSON</button>
<label><input type="checkbox" id="show-values"> values</label>
<span class="hint" id="hint"></span>
<span class="hint" id="sparse"></span>
</header>
<main>
<div class="panel"><h2 id="view-title">view</h2><canvas id="view"></canvas></div>
<div class="panel" id="side"><h2>model view: every layer × head (click one)</h2><div id="thumbs"></div>
<div id="side-extra"></div><h2>values</h2><pre id="values">(tick "values")</pre></div>
</main>
<div id="status" hidden></div>
<script id="payload" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("payload").textContent);
const $ = (id) => document.getElementById(id);
const S = {layer: 0, head: 0, query: null, key: null, overlay: null};
const decoded = {};
if (D.top_k) {  // the page stores only each row's largest weights: say so
  $("sparse").textContent = "rows over " + D.tk + " keys: each keeps its " + D.top_k + " largest weights (Save JSON gives the dropped mass)";
}

function u16(b64) {
  const bin = atob(b64), bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new Uint16Array(bytes.buffer);
}
function headData(l, h) {  // decoded on first use
  const key = l + "/" + h;
  if (!decoded[key]) {
    const e = D.attention[l][h];
    decoded[key] = e.dense ? {dense: u16(e.dense)} : {k: e.topk, index: u16(e.index), value: u16(e.value), dropped: u16(e.dropped)};
  }
  return decoded[key];
}
function row1(l, h, q) {
  const d = headData(l, h), out = new Float32Array(D.tk);
  if (d.dense) { for (let j = 0; j < D.tk; j++) out[j] = d.dense[q * D.tk + j] / 65535; }
  else { for (let j = 0; j < d.k; j++) out[d.index[q * d.k + j]] = d.value[q * d.k + j] / 65535; }
  return out;
}
function row(q) {  // the selected head's row, or the average over heads
  if (S.head !== "avg") return row1(S.layer, S.head, q);
  const out = new Float32Array(D.tk);
  for (let h = 0; h < D.heads; h++) { const r = row1(S.layer, h, q); for (let j = 0; j < D.tk; j++) out[j] += r[j] / D.heads; }
  return out;
}
function column(k) { const out = new Float32Array(D.tq); for (let q = 0; q < D.tq; q++) out[q] = row(q)[k]; return out; }
function topIndices(v, n) {
  return Array.from(v.keys()).sort((a, b) => v[b] - v[a] || a - b).slice(0, n);
}
function heat(t) {  // 0..1 -> a warm colour
  const r = Math.round(255 * Math.min(1, 2 * t)), g = Math.round(255 * Math.max(0, 2 * t - 1) * 0.85);
  return "rgb(" + r + "," + g + "," + Math.round(60 * (1 - t)) + ")";
}
function setStatus(top) {
  const s = $("status");
  s.dataset.layer = S.layer; s.dataset.head = S.head;
  s.dataset.query = S.query === null ? "" : S.query; s.dataset.key = S.key === null ? "" : S.key;
  s.dataset.top = top ? top.join(",") : "";
}
function showValues(v, labels) {
  if (!$("show-values").checked) { $("values").textContent = "(tick \"values\")"; return; }
  if (!v) { $("values").textContent = "(select a position)"; return; }
  const lines = [];
  for (const j of topIndices(v, Math.min(v.length, 64))) lines.push(String(j).padStart(5) + "  " + v[j].toFixed(4) + "  " + (labels ? JSON.stringify(labels[j]) : ""));
  $("values").textContent = lines.join("\n");
}
let current = null;  // {values, labels} of the view, for the values panel and Save JSON

// ---- model view: one thumbnail per layer and head ---------------------------------------------------
function thumbnails() {
  const box = $("thumbs"), px = 56, n = Math.min(D.tq, px), m = Math.min(D.tk, px);
  box.style.gridTemplateColumns = "repeat(" + D.heads + "," + (px + 4) + "px)";
  for (let l = 0; l < D.layers; l++) for (let h = 0; h < D.heads; h++) {
    const c = document.createElement("canvas"); c.width = m; c.height = n; c.style.width = c.style.height = px + "px";
    c.title = "layer " + l + ", head " + h; c.dataset.layer = l; c.dataset.head = h;
    let badge = "";
    if (D.detectors) {  // head-detector scores on this text (TransformerLens's definitions): in the tooltip, and
      // a letter on heads that score above 0.3 (P previous token, D duplicate token, I induction)
      const sc = (k) => D.detectors[k][l][h];
      c.title += ": previous-token " + sc("previous_token").toFixed(2) + ", duplicate-token " +
        sc("duplicate_token").toFixed(2) + ", induction " + sc("induction").toFixed(2);
      badge = [["previous_token", "P"], ["duplicate_token", "D"], ["induction", "I"]].filter(([k]) => sc(k) > 0.3).map(([, b]) => b).join("");
      c.dataset.detected = badge;
    }
    const ctx = c.getContext("2d"), img = ctx.createImageData(m, n);
    for (let i = 0; i < n; i++) {
      const q = Math.floor(i * D.tq / n), r = row1(l, h, q);
      for (let j = 0; j < m; j++) {
        let v = 0; const j0 = Math.floor(j * D.tk / m), j1 = Math.max(j0 + 1, Math.floor((j + 1) * D.tk / m));
        for (let k = j0; k < j1; k++) v = Math.max(v, r[k]);
        const t = Math.sqrt(v), o = 4 * (i * m + j);
        img.data[o] = 255 * Math.min(1, 2 * t); img.data[o + 1] = 217 * Math.max(0, 2 * t - 1); img.data[o + 2] = 60 * (1 - t); img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    if (badge) { ctx.font = "bold 10px sans-serif"; ctx.fillStyle = "#0cf"; ctx.fillText(badge, 2, 10); }
    c.addEventListener("click", () => { $("layer").value = l; $("head").value = h; S.layer = l; S.head = h; draw(); });
    box.appendChild(c);
  }
}
function markThumb() {
  for (const c of $("thumbs").children) c.classList.toggle("sel", +c.dataset.layer === S.layer && String(c.dataset.head) === String(S.head));
}

// ---- text (GPT): the head view -------------------------------------------------------------------------
const LINE = 18, COLW = 160, GAP = 220;
function drawText() {
  const cv = $("view"), T = D.tq, ctx = cv.getContext("2d");
  cv.width = 2 * COLW + GAP; cv.height = T * LINE + 10;
  ctx.clearRect(0, 0, cv.width, cv.height);
  ctx.font = "12px monospace"; ctx.textBaseline = "middle";
  const y = (i) => 5 + i * LINE + LINE / 2;
  const label = (t) => JSON.stringify(t).slice(1, -1).slice(0, 18);
  let top = null, focus = null;
  if (S.query !== null) { focus = row(S.query); top = topIndices(focus, 5); }
  else if (S.key !== null) { focus = column(S.key); top = topIndices(focus, 5); }
  ctx.lineWidth = 2;
  const queries = S.query !== null ? [S.query] : Array.from({length: T}, (_, i) => i);
  for (const q of queries) {
    const r = row(q);
    for (let k = 0; k < D.tk; k++) {
      if (S.key !== null && k !== S.key) continue;
      const w = r[k]; if (w < 0.02) continue;
      ctx.strokeStyle = "rgba(200,60,30," + Math.min(1, w).toFixed(3) + ")";
      ctx.beginPath(); ctx.moveTo(COLW, y(q)); ctx.lineTo(COLW + GAP, y(k)); ctx.stroke();
    }
  }
  for (let i = 0; i < T; i++) {
    const qSel = S.query === i, kSel = S.key === i;
    const made = D.generated_from != null && i >= D.generated_from;  // generated by the model: green
    if (focus && S.query !== null) { ctx.fillStyle = "rgba(200,60,30," + focus[i].toFixed(3) + ")"; ctx.fillRect(COLW + GAP, y(i) - LINE / 2, COLW, LINE); }
    if (focus && S.key !== null) { ctx.fillStyle = "rgba(40,90,200," + focus[i].toFixed(3) + ")"; ctx.fillRect(0, y(i) - LINE / 2, COLW, LINE); }
    ctx.fillStyle = qSel ? "#d33" : made ? "#080" : "#222"; ctx.textAlign = "right"; ctx.fillText(label(D.tokens[i]), COLW - 6, y(i));
    ctx.fillStyle = kSel ? "#25c" : made ? "#080" : "#222"; ctx.textAlign = "left"; ctx.fillText(label(D.tokens[i]), COLW + GAP + 6, y(i));
  }
  $("view-title").textContent = "head view: hover a token on the left (what it attends to) or the right (what attends to it)" +
    (D.generated_from != null ? "; green tokens were generated, each row as it was produced" : "");
  setStatus(top);
  current = {values: focus ? Array.from(focus) : null, labels: D.tokens};
  showValues(focus, D.tokens);
  const nt = $("side-extra");
  if (S.query !== null && D.next_tokens) {
    let html = "<h2>next token after position " + S.query + "</h2><table id=\"next\">";
    for (let i = 0; i < D.next_tokens[S.query].length; i++) html += "<tr><td>" + JSON.stringify(D.next_tokens[S.query][i]).replace(/</g, "&lt;") + "</td><td>" + D.next_probs[S.query][i].toFixed(4) + "</td></tr>";
    html += "</table>";
    if (D.q && S.head !== "avg") {  // the neuron view: the lecture's walk through one row of attention
      const q = D.q[S.layer][S.head][S.query], ks = D.k[S.layer][S.head], d = q.length, r = row(S.query);
      const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);
      html += "<h2>neuron view: layer " + S.layer + ", head " + S.head + ", query " + S.query + "</h2>" +
        "<p class=\"hint\">q = [" + q.slice(0, 8).map((x) => x.toFixed(2)).join(", ") + (d > 8 ? ", …" : "") +
        "] (d_k = " + d + "); score = q·k/√d_k + position bias; softmax over the keys</p><table id=\"neuron\">" +
        "<tr><th>key</th><th>q·k</th><th>÷√d_k</th><th>score</th><th>softmax</th></tr>";
      for (const j of topIndices(r, Math.min(12, D.tk))) {
        const qk = dot(q, ks[j]), s = D.scores[S.layer][S.head][S.query][j];
        html += "<tr><td>" + JSON.stringify(D.tokens[j]).replace(/</g, "&lt;") + " (" + j + ")</td><td>" + qk.toFixed(3) +
          "</td><td>" + (qk / Math.sqrt(d)).toFixed(3) + "</td><td>" + (s < -1e8 ? "masked" : s.toFixed(3)) + "</td><td>" + r[j].toFixed(4) + "</td></tr>";
      }
      html += "</table>";
    }
    if (D.sae) {  // a sparse autoencoder's latents at this position (attnlab sae): what the stream holds there
      html += "<h2>SAE latents at " + D.sae.hook + ", position " + S.query + "</h2><table id=\"sae\">";
      for (const [latent, act] of D.sae.latents[S.query]) html += "<tr><td>latent " + latent + "</td><td>" + act.toFixed(3) + "</td></tr>";
      if (!D.sae.latents[S.query].length) html += "<tr><td class=\"hint\">none active</td></tr>";
      html += "</table>";
    }
    if (D.lens_tokens) {  // the logit lens: what the stream would predict if the model stopped after each layer
      html += "<h2>logit lens at position " + S.query + "</h2><table id=\"lens\">";
      for (let l = 0; l < D.lens_tokens.length; l++) html += "<tr><td>" + (l === 0 ? "embeddings" : "after block " + (l - 1)) + "</td><td>" + JSON.stringify(D.lens_tokens[l][S.query]).replace(/</g, "&lt;") + "</td><td>" + D.lens_probs[l][S.query].toFixed(4) + "</td></tr>";
      html += "</table>";
    }
    nt.innerHTML = html;
  } else nt.innerHTML = D.next_tokens ? "<p class=\"hint\">hover a token to see the next-token distribution there</p>" : "";
}
function textEvents() {
  $("view").addEventListener("mousemove", (e) => {
    const r = $("view").getBoundingClientRect(), x = e.clientX - r.left, i = Math.floor((e.clientY - r.top - 5) / LINE);
    if (i < 0 || i >= D.tq) return;
    if (x < COLW) { if (S.query === i && S.key === null) return; S.query = i; S.key = null; }
    else if (x > COLW + GAP) { if (S.key === i && S.query === null) return; S.key = i; S.query = null; }
    else return;
    draw();
  });
  $("view").addEventListener("mouseleave", () => { S.query = null; S.key = null; draw(); });
}

// ---- images (ViT) -----------------------------------------------------------------------------------------
const IMG = new Image(); let PX = 384;
function overlayAlpha() { const o = $("opacity"); return o ? (o.value / 100).toFixed(2) : "0.55"; }  // the image shows through
function drawImage() {
  const cv = $("view"), ctx = cv.getContext("2d"), [gh, gw] = D.grid;
  cv.width = PX; cv.height = PX;
  ctx.imageSmoothingEnabled = false; ctx.drawImage(IMG, 0, 0, PX, PX);
  let v = null, top = null;
  if (S.overlay) v = D.rollout[S.overlay];
  else if (S.query !== null) { const r = row(S.query); v = Array.from(r.slice(D.n_prefix)); }
  if (v) {
    const mx = Math.max(...v) || 1; top = topIndices(Float32Array.from(v), 5);
    for (let p = 0; p < gh * gw; p++) {
      ctx.fillStyle = heat(v[p] / mx).replace("rgb", "rgba").replace(")", "," + overlayAlpha() + ")");
      ctx.fillRect((p % gw) * PX / gw, Math.floor(p / gw) * PX / gh, PX / gw, PX / gh);
    }
  }
  ctx.strokeStyle = "rgba(255,255,255,0.35)"; ctx.lineWidth = 1;
  for (let i = 1; i < gw; i++) { ctx.beginPath(); ctx.moveTo(i * PX / gw, 0); ctx.lineTo(i * PX / gw, PX); ctx.stroke(); }
  for (let i = 1; i < gh; i++) { ctx.beginPath(); ctx.moveTo(0, i * PX / gh); ctx.lineTo(PX, i * PX / gh); ctx.stroke(); }
  if (S.query !== null && S.query >= D.n_prefix && !S.overlay) {
    const p = S.query - D.n_prefix; ctx.strokeStyle = "#0cf"; ctx.lineWidth = 3;
    ctx.strokeRect((p % gw) * PX / gw, Math.floor(p / gw) * PX / gh, PX / gw, PX / gh);
  }
  $("view-title").textContent = S.overlay ? "attention rollout (" + S.overlay + ")" : (S.query === null ? "click a patch to see where it attends" : (S.query < D.n_prefix ? "class-token attention" : "attention of patch " + (S.query - D.n_prefix)));
  setStatus(top);
  current = {values: v, labels: null};
  showValues(v ? Float32Array.from(v) : null, null);
}
function imageControls() {
  const x = $("extra");
  x.innerHTML = (D.n_prefix ? "<button id=\"cls\">class token</button> " : "") +
    "rollout <select id=\"fusion\"><option value=\"\">off</option><option>mean</option><option>max</option><option>min</option></select>" +
    " discard <select id=\"discard\"><option>0.0</option><option>0.5</option><option>0.9</option></select>" +
    " <label>heat map <input type=\"range\" id=\"opacity\" min=\"0\" max=\"100\" value=\"55\"></label>";
  if (D.n_prefix) $("cls").addEventListener("click", () => { S.overlay = null; S.query = 0; draw(); });
  const ro = () => { const f = $("fusion").value; S.overlay = f ? f + "/" + $("discard").value : null; draw(); };
  $("fusion").addEventListener("change", ro); $("discard").addEventListener("change", ro);
  $("opacity").addEventListener("input", () => draw());
  $("view").addEventListener("click", (e) => {
    const r = $("view").getBoundingClientRect(), [gh, gw] = D.grid;
    const c = Math.floor((e.clientX - r.left) / (PX / gw)), rr = Math.floor((e.clientY - r.top) / (PX / gh));
    if (c < 0 || c >= gw || rr < 0 || rr >= gh) return;
    S.overlay = null; $("fusion").value = ""; S.query = D.n_prefix + rr * gw + c; draw();
  });
  // mean attention distance per head against depth
  const cv = document.createElement("canvas"); cv.width = 260; cv.height = 180; cv.id = "distance";
  $("side-extra").innerHTML = "<h2>mean attention distance (pixels) per head, by layer</h2>"; $("side-extra").appendChild(cv);
  const ctx = cv.getContext("2d"), L = D.distance.length, mx = Math.max(...D.distance.flat()) || 1;
  ctx.strokeStyle = "#999"; ctx.strokeRect(30, 10, 220, 150); ctx.fillStyle = "#333"; ctx.font = "10px sans-serif";
  ctx.fillText(mx.toFixed(1), 2, 14); ctx.fillText("0", 18, 160); ctx.fillText("px", 8, 90);
  for (let l = 0; l < L; l++) ctx.fillText(String(l), 30 + 220 * (l + 0.5) / L - 3, 172);  // a tick per layer
  ctx.fillText("layer", 225, 178);
  for (let l = 0; l < L; l++) for (const d of D.distance[l]) {
    ctx.fillStyle = "#c33"; ctx.beginPath(); ctx.arc(30 + 220 * (l + 0.5) / L, 160 - 150 * d / mx, 3, 0, 7); ctx.fill();
  }
}

// ---- cross-attention (seq2seq) ---------------------------------------------------------------------------
const CELL = 22, LEFT = 120, TOP = 90;
function drawCross() {
  const cv = $("view"), ctx = cv.getContext("2d"), T = D.tq, Sn = D.tk;
  const cell = Math.max(4, Math.min(CELL, Math.floor(900 / Math.max(T, Sn))));
  cv.width = LEFT + Sn * cell + 10; cv.height = TOP + T * cell + 10;
  ctx.clearRect(0, 0, cv.width, cv.height);
  for (let t = 0; t < T; t++) {
    const r = row(t);
    for (let s = 0; s < Sn; s++) { ctx.fillStyle = heat(Math.sqrt(r[s])); ctx.fillRect(LEFT + s * cell, TOP + t * cell, cell - 1, cell - 1); }
  }
  ctx.font = "11px sans-serif"; ctx.fillStyle = "#222"; ctx.textBaseline = "middle";
  let top = null, focus = null;
  if (S.query !== null) { focus = row(S.query); top = topIndices(focus, 5); }
  const rows = D.rows || D.target, cols = D.cols || D.source;  // (the model view swaps them)
  for (let t = 0; t < T; t++) { ctx.fillStyle = t === S.query ? "#d33" : "#222"; ctx.textAlign = "right"; ctx.fillText(rows[t].slice(0, 16), LEFT - 6, TOP + t * cell + cell / 2); }
  for (let s = 0; s < Sn; s++) {
    ctx.save(); ctx.translate(LEFT + s * cell + cell / 2, TOP - 6); ctx.rotate(-Math.PI / 3);
    ctx.fillStyle = focus ? "rgba(200,40,20," + (0.25 + 0.75 * focus[s] / Math.max(...focus)).toFixed(3) + ")" : "#222";
    ctx.textAlign = "left"; ctx.fillText(cols[s].slice(0, 14), 0, 0); ctx.restore();
  }
  if (S.query !== null) { ctx.strokeStyle = "#0cf"; ctx.lineWidth = 2; ctx.strokeRect(LEFT, TOP + S.query * cell, Sn * cell, cell); }
  const which = $("which") ? $("which").value : "cross";
  $("view-title").textContent = ({cross: "cross-attention: target (rows) × source (columns)", encoder_self: "encoder self-attention: source × source",
    decoder_self: "decoder self-attention (masked): target × target"})[which] + "; hover a row";
  setStatus(top);
  current = {values: focus ? Array.from(focus) : null, labels: cols};
  showValues(focus, cols);
}
function crossViews() {  // a Transformer: switch between cross, encoder self- and decoder self-attention
  if (!D.views) return;
  const cross = {attention: D.attention, layers: D.layers, heads: D.heads, tq: D.tq, tk: D.tk, rows: D.target, cols: D.source};
  const views = {cross: cross,
    encoder_self: {...D.views.encoder_self, rows: D.source, cols: D.source},
    decoder_self: {...D.views.decoder_self, rows: D.target, cols: D.target}};
  $("extra").innerHTML = "attention <select id=\"which\"><option value=\"cross\">cross (decoder → encoder)</option>" +
    "<option value=\"encoder_self\">encoder self</option><option value=\"decoder_self\">decoder self (masked)</option></select>";
  $("which").addEventListener("change", () => {
    Object.assign(D, views[$("which").value]);
    for (const k in decoded) delete decoded[k];
    $("layer").innerHTML = ""; for (let l = 0; l < D.layers; l++) $("layer").add(new Option(String(l), l));
    S.layer = 0; S.query = null; $("thumbs").innerHTML = ""; thumbnails(); draw();
  });
}
function crossEvents() {
  $("view").addEventListener("mousemove", (e) => {
    const r = $("view").getBoundingClientRect(), cell = Math.max(4, Math.min(CELL, Math.floor(900 / Math.max(D.tq, D.tk))));
    const t = Math.floor((e.clientY - r.top - TOP) / cell);
    if (t < 0 || t >= D.tq || t === S.query) return;
    S.query = t; draw();
  });
}

// ---- shared controls -----------------------------------------------------------------------------------
function draw() { markThumb(); ({text: drawText, image: drawImage, cross: drawCross})[D.kind](); }
function download(name, url) { const a = document.createElement("a"); a.href = url; a.download = name; document.body.appendChild(a); a.click(); a.remove(); }
function init() {
  for (let l = 0; l < D.layers; l++) $("layer").add(new Option(String(l), l));
  for (let h = 0; h < D.heads; h++) $("head").add(new Option(String(h), h));
  $("head").add(new Option("average", "avg"));
  $("layer").addEventListener("change", () => { S.layer = +$("layer").value; draw(); });
  $("head").addEventListener("change", () => { const v = $("head").value; S.head = v === "avg" ? "avg" : +v; draw(); });
  $("show-values").addEventListener("change", draw);
  $("save-png").addEventListener("click", () => download("attention_L" + S.layer + "_H" + S.head + ".png", $("view").toDataURL("image/png")));
  $("save-json").addEventListener("click", () => {
    const d = S.head === "avg" || S.query === null ? null : headData(S.layer, S.head);
    const dropped = d && d.dropped ? d.dropped[S.query] / 65535 : null;  // the mass the top-k row leaves out
    const blob = new Blob([JSON.stringify({kind: D.kind, layer: S.layer, head: S.head, query: S.query, key: S.key, overlay: S.overlay, top_k: D.top_k || null, dropped: dropped, values: current && current.values, labels: current && current.labels})], {type: "application/json"});
    download("attention_L" + S.layer + "_H" + S.head + ".json", URL.createObjectURL(blob));
  });
  thumbnails();
  if (D.kind === "text") { textEvents(); $("hint").textContent = D.tq + " tokens"; }
  if (D.kind === "cross") { crossEvents(); crossViews(); }
  if (D.kind === "image") {
    imageControls();
    IMG.onload = () => { draw(); window.explorerReady = true; };
    IMG.src = D.image;
    return;
  }
  draw();
  window.explorerReady = true;
}
init();
</script>
</body></html>
"""
