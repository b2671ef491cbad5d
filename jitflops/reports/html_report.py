"""The HTML report: one self-contained page (no network, works offline) to open and share.

* a zoomable icicle of the module tree: click a box to focus it, the breadcrumb goes back; every
  box shows its name, type and share of the metric;
* a metric switch (FLOPs, MACs, parameters, latency, activations, FLOP/s, MFU) that sizes and
  colours the boxes, with a legend and a scale; modules never called, or without a value for the
  metric, are hatched grey;
* a details panel: the module's parameters, MACs, FLOPs, activations, latency, FLOP/s, MFU and its
  top ops;
* a roofline: each timed module by arithmetic intensity (FLOPs per byte its ops read and write:
  :class:`~jitflops.ByteCountAnalysis`) against achieved FLOP/s, under the roofs of the peak FLOP/s
  and the memory bandwidth; the details panel shows the module's bytes, intensity, and where the
  profile predicted it, its predicted time beside the measured one;
* with a memory estimate (:func:`jitflops.estimates.memory_footprint`): a memory metric for the icicle (each
  module's parameters, buffers, gradients, optimizer state and saved activations), a bar of what
  was alive at the peak, whether it fits, and each module's bytes per category in its details.

The page carries the profile's JSON document (:func:`jitflops.reports.files.profile_to_dict`) and draws it
with a small script. Importing this module gives profiles and analyses a ``_repr_html_`` (the
same report, inline in a notebook): the data classes do not import their reports, the report
attaches itself (``jitflops`` imports it).
"""

from __future__ import annotations

import dataclasses
import html
import json
import uuid
from typing import Any, Optional

from .files import profile_to_dict
from .file_output import write_text
from ..estimates.devices import DeviceSpec
from ..engine.jit_analysis import JitModelAnalysis
from ..estimates.memory_estimate import CATEGORIES, MemoryEstimate
from .memory_report import format_bytes
from ..profiling.model_profile import ModelProfile
from ..timing.peak_flops import memory_bandwidth as peak_memory_bandwidth

METRICS = {
    "flops": "FLOPs",
    "macs": "MACs",
    "params": "parameters",
    "latency": "latency (s)",
    "activations": "activations",
    "flops_per_second": "FLOP/s",
    "mfu": "MFU",
    "comm_bytes": "communication (bytes)",
    "bytes": "bytes read and written",
}
MEMORY_METRIC = {"memory": "memory (bytes, estimated)"}
_MEMORY_COLOURS = {"parameters": "#1a5fb4", "buffers": "#62a0ea", "inputs": "#98c1d9", "gradients": "#e66100",
                   "optimizer_state": "#c64600", "saved_activations": "#26a269", "outputs": "#8ff0a4", "temporaries": "#9a9996"}

_STYLE = """
.jf{font-family:system-ui,sans-serif;font-size:13px;color:#222;max-width:1280px}
.jf h2{font-size:18px;margin:4px 0}
.jf .bar{display:flex;gap:16px;align-items:center;margin:8px 0;flex-wrap:wrap}
.jf .crumbs span{cursor:pointer;color:#1a5fb4;text-decoration:underline}
.jf .crumbs span.here{color:#222;text-decoration:none;cursor:default}
.jf .main{display:flex;gap:12px;align-items:flex-start}
.jf svg{background:#fff;border:1px solid #ccc;display:block}
.jf .box{cursor:pointer}
.jf .box text{pointer-events:none;font-size:11px}
.jf .box.selected rect{stroke:#000;stroke-width:2}
.jf .details{min-width:300px;max-width:340px;border:1px solid #ccc;padding:8px;background:#fafafa}
.jf .details table{border-collapse:collapse;width:100%}
.jf .details td{padding:2px 4px;border-bottom:1px solid #eee}
.jf .details td.v{text-align:right;font-variant-numeric:tabular-nums}
.jf .legend{display:flex;align-items:center;gap:6px}
.jf .ramp{width:160px;height:12px;background:linear-gradient(to right,rgb(255,245,200),rgb(200,30,30))}
.jf .swatch{width:14px;height:12px;display:inline-block;background:repeating-linear-gradient(45deg,#ddd 0 3px,#bbb 3px 6px)}
.jf .note{color:#555;margin:6px 0}
.jf .membar{display:flex;width:900px;height:16px;border:1px solid #999;margin:4px 0}
.jf .membar div{height:100%}
"""

_SCRIPT = r"""
(function(root, data){
  const $ = (sel) => root.querySelector(sel);
  const mods = data.modules, byName = {};
  mods.forEach(m => { byName[m.name] = m; m.children = []; });
  mods.forEach(m => { if (m.name !== "") { const parent = m.name.includes(".") ? m.name.slice(0, m.name.lastIndexOf(".")) : ""; (byName[parent] || byName[""]).children.push(m); } });
  const labels = data.metrics;
  const units = {flops: "", macs: "", params: "", latency: "s", activations: "", flops_per_second: "FLOP/s", mfu: "", comm_bytes: "B", bytes: "B", memory: "B"};
  function value(m, metric){
    if (metric === "memory") return m.memory ? m.memory.total : null;
    if (metric === "latency") return m.latency ? m.latency.median_s : null;
    if (metric === "mfu") return m.mfu;
    if (metric === "flops_per_second") return m.flops_per_second;
    return m[metric];
  }
  function fmt(v, metric){
    if (v === null || v === undefined) return "n/a";
    if (metric === "mfu") return (100 * v).toFixed(2) + "%";
    if (metric === "latency") return v >= 1 ? v.toFixed(3) + " s" : v >= 1e-3 ? (v * 1e3).toFixed(3) + " ms" : (v * 1e6).toFixed(1) + " us";
    const a = Math.abs(v);
    if (metric === "memory") {  // binary units, as the text report and device memory sizes
      for (const [s, d] of [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) if (a >= d) return (v / d).toFixed(2) + " " + s;
      return v + " B";
    }
    for (const [s, d] of [["T", 1e12], ["G", 1e9], ["M", 1e6], ["K", 1e3]]) if (a >= d) return (v / d).toFixed(2) + " " + s + (units[metric] || "");
    return (Number.isInteger(v) ? v.toLocaleString("en") : v.toPrecision(3)) + (units[metric] ? " " + units[metric] : "");
  }
  function colour(share){
    share = Math.max(0, Math.min(1, share));
    return "rgb(" + Math.round(255 - 55 * share) + "," + Math.round(245 - 215 * share) + "," + Math.round(200 - 170 * share) + ")";
  }
  let metric = data.default_metric, focus = byName[""], selected = focus;
  const svg = $(".icicle"), width = 900, rowHeight = 34;
  function depthBelow(m){ return 1 + Math.max(0, ...m.children.map(depthBelow)); }
  function draw(){
    const depth = depthBelow(focus), height = depth * rowHeight;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("height", height);
    svg.innerHTML = "";
    const total = value(focus, metric);
    const additive = !["flops_per_second", "mfu"].includes(metric);
    let best = 0;
    (function scan(m){ const v = value(m, metric); if (v) best = Math.max(best, v); m.children.forEach(scan); })(focus);
    function place(m, x, w, level){
      const v = value(m, metric), missing = !m.called || v === null || v === undefined;
      const g = document.createElementNS("http://www.w3.org/2000/svg", "g");
      g.setAttribute("class", "box" + (missing ? " no-value" : "") + (m === selected ? " selected" : ""));
      g.setAttribute("data-name", m.name);
      const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
      r.setAttribute("x", x.toFixed(2)); r.setAttribute("y", level * rowHeight);
      r.setAttribute("width", Math.max(w - 1, 0.5).toFixed(2)); r.setAttribute("height", rowHeight - 2);
      r.setAttribute("fill", missing ? "url(#" + data.id + "-hatch)" : colour(best ? v / best : 0));
      r.setAttribute("stroke", "#666"); r.setAttribute("stroke-width", "0.4");
      g.appendChild(r);
      const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
      title.textContent = (m.name || "model") + " (" + m.type + "): " + labels[metric] + " " + fmt(v, metric) + (m.called ? "" : " (not called)");
      g.appendChild(title);
      if (w > 40) {
        const t = document.createElementNS("http://www.w3.org/2000/svg", "text");
        const dark = !missing && best && v / best > 0.6;
        t.setAttribute("x", x + 3); t.setAttribute("y", level * rowHeight + 13);
        t.setAttribute("fill", dark ? "#fff" : "#111");
        const share = additive && total ? " " + (100 * (v || 0) / total).toFixed(1) + "%" : " " + fmt(v, metric);
        const name = m.name === "" ? "model" : m.name.slice(m.name.lastIndexOf(".") + 1);
        const line1 = document.createElementNS("http://www.w3.org/2000/svg", "tspan");
        line1.textContent = name + share;
        const line2 = document.createElementNS("http://www.w3.org/2000/svg", "tspan");
        line2.setAttribute("x", x + 3); line2.setAttribute("dy", 13); line2.setAttribute("fill", dark ? "#eee" : "#444");
        line2.textContent = m.type;
        t.appendChild(line1); t.appendChild(line2);
        const clip = Math.floor((w - 6) / 6.2);
        if (clip < name.length + share.length) line1.textContent = (name + share).slice(0, Math.max(clip, 1));
        if (clip < m.type.length) line2.textContent = m.type.slice(0, Math.max(clip, 1));
        g.appendChild(t);
      }
      g.addEventListener("click", (event) => { event.stopPropagation(); selected = m; if (m.children.length) focus = m; render(); });
      svg.appendChild(g);
      const kids = m.children;
      const weights = kids.map(c => additive ? Math.max(value(c, metric) || 0, 0) : (c.flops || 0));
      const sum = weights.reduce((a, b) => a + b, 0);
      const sliver = kids.length ? Math.min(w * 0.03 / kids.length, 6) : 0;
      const slivers = weights.filter(z => !z).length * sliver;
      let offset = x;
      kids.forEach((c, i) => {
        const cw = sum ? (weights[i] ? (w - slivers) * weights[i] / sum : sliver) : w / kids.length;
        place(c, offset, cw, level + 1);
        offset += cw;
      });
    }
    const defs = document.createElementNS("http://www.w3.org/2000/svg", "defs");
    defs.innerHTML = '<pattern id="' + data.id + '-hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#e4e4e4"/><line x1="0" y1="0" x2="0" y2="6" stroke="#b0b0b0" stroke-width="3"/></pattern>';
    svg.appendChild(defs);
    place(focus, 0, width, 0);
    $(".legend-label").textContent = labels[metric] + ": " + fmt(best ? 0 : null, metric).replace("n/a", "0") + " to " + fmt(best || null, metric);
  }
  function crumbs(){
    const bar = $(".crumbs"); bar.innerHTML = "";
    const parts = focus.name === "" ? [""] : ["", ...focus.name.split(".").map((_, i, a) => a.slice(0, i + 1).join("."))];
    parts.forEach((name, i) => {
      const s = document.createElement("span");
      s.textContent = name === "" ? "model" : name.slice(name.lastIndexOf(".") + 1);
      s.setAttribute("data-name", name);
      if (i === parts.length - 1) s.className = "here"; else s.addEventListener("click", () => { focus = byName[name]; selected = focus; render(); });
      bar.appendChild(s);
      if (i < parts.length - 1) bar.appendChild(document.createTextNode(" › "));
    });
  }
  function details(){
    const m = selected, rows = [["module", m.name || "(model)"], ["type", m.type], ["called", m.called ? "yes" : "no"]];
    ["params", "macs", "flops", "activations", "bytes", "comm_bytes"].forEach(k => rows.push([labels[k], m[k].toLocaleString("en")]));
    if (m.intensity) rows.push(["arithmetic intensity", m.intensity.toFixed(2) + " FLOP/byte"]);
    if (m.predicted_s != null) rows.push(["predicted (roofline)", fmt(m.predicted_s, "latency") + (m.predicted_to_measured ? ", " + m.predicted_to_measured.toFixed(2) + " x measured" : "")]);
    ["latency", "flops_per_second", "mfu"].forEach(k => rows.push([labels[k], fmt(value(m, k), k)]));
    if (m.memory) Object.entries(m.memory).forEach(e => { if (e[0] !== "name" && e[1]) rows.push(["memory: " + e[0].replace("_", " "), fmt(e[1], "memory")]); });
    const ops = Object.entries(m.macs_by_op).concat(Object.entries(m.elementwise_flops_by_op)).sort((a, b) => b[1] - a[1]).slice(0, 5);
    let text = "<b>" + (m.name || "model") + "</b><table>" + rows.map(r => "<tr><td>" + r[0] + '</td><td class="v">' + String(r[1]).replace(/</g, "&lt;") + "</td></tr>").join("") + "</table>";
    text += "<p><b>top ops</b> (MACs; elementwise: flops)</p><table class='ops'>" + (ops.length ? ops.map(o => "<tr><td>" + o[0] + '</td><td class="v">' + fmt(o[1], "macs") + "</td></tr>").join("") : "<tr><td>none counted</td></tr>") + "</table>";
    $(".details").innerHTML = text;
  }
  function roofline(){
    const view = $(".roofline"), w = 900, h = 420, pad = 56;
    view.innerHTML = "";
    const points = mods.filter(m => m.flops_per_second && m.bytes > 0 && m.flops > 0).map(m => ({m: m, x: m.flops / m.bytes, y: m.flops_per_second}));
    const peak = data.peak_flops, bandwidth = data.memory_bandwidth;
    $(".roof-note").textContent = points.length ? ("peak " + fmt(peak, "flops_per_second") + ", memory bandwidth " + fmt(bandwidth, "macs") + "B/s; the ridge at " + (peak / bandwidth).toFixed(1) + " FLOP/byte") : "No module was timed: profile with timing to see the roofline.";
    if (!points.length) return;
    const xs = points.map(p => p.x).concat([peak / bandwidth]), ys = points.map(p => p.y).concat([peak]);
    const x0 = Math.log10(Math.min(...xs)) - 0.5, x1 = Math.log10(Math.max(...xs)) + 0.5;
    const y0 = Math.log10(Math.min(...ys)) - 0.5, y1 = Math.log10(Math.max(...ys)) + 0.3;
    const X = v => pad + (Math.log10(v) - x0) / (x1 - x0) * (w - 2 * pad), Y = v => h - pad - (Math.log10(v) - y0) / (y1 - y0) * (h - 2 * pad);
    let s = '<line x1="' + pad + '" y1="' + (h - pad) + '" x2="' + (w - pad) + '" y2="' + (h - pad) + '" stroke="#333"/><line x1="' + pad + '" y1="' + pad + '" x2="' + pad + '" y2="' + (h - pad) + '" stroke="#333"/>';
    s += '<text x="' + (w / 2) + '" y="' + (h - 16) + '" text-anchor="middle">arithmetic intensity (FLOPs per byte its ops read and write, log)</text>';
    s += '<text x="14" y="' + (h / 2) + '" transform="rotate(-90 14 ' + (h / 2) + ')" text-anchor="middle">achieved FLOP/s (log)</text>';
    const ridge = peak / bandwidth, left = Math.pow(10, x0), right = Math.pow(10, x1);
    s += '<polyline class="roof" fill="none" stroke="#c01c28" stroke-width="2" points="' + X(left) + "," + Y(Math.max(bandwidth * left, Math.pow(10, y0))) + " " + X(ridge) + "," + Y(peak) + " " + X(right) + "," + Y(peak) + '"/>';
    points.forEach(p => {
      const bound = p.x < ridge ? "memory-bound" : "compute-bound";
      s += '<circle class="point ' + bound + '" data-name="' + p.m.name + '" cx="' + X(p.x) + '" cy="' + Y(p.y) + '" r="4" fill="' + (bound === "memory-bound" ? "#1a5fb4" : "#e66100") + '" fill-opacity="0.7"><title>' + (p.m.name || "model") + " (" + p.m.type + "): " + p.x.toFixed(2) + " FLOP/byte, " + fmt(p.y, "flops_per_second") + ", " + bound + "</title></circle>";
    });
    view.setAttribute("viewBox", "0 0 " + w + " " + h);
    view.innerHTML = s;
  }
  function memoryBar(){
    const peak = data.memory_peak;
    if (!peak) return;
    $(".membar").innerHTML = Object.entries(peak.at_peak).filter(e => e[1] > 0).map(e =>
      '<div class="mem-' + e[0] + '" style="width:' + (100 * e[1] / peak.bytes).toFixed(3) + '%;background:' + data.memory_colours[e[0]] + '" title="' + e[0].replace("_", " ") + ": " + fmt(e[1], "memory") + '"></div>').join("");
  }
  function render(){ draw(); crumbs(); details(); }
  memoryBar();
  $(".metric").value = metric;
  $(".metric").addEventListener("change", (e) => { metric = e.target.value; render(); });
  $(".view").addEventListener("change", (e) => {
    const tree = e.target.value === "tree";
    $(".tree-view").style.display = tree ? "" : "none"; $(".roof-view").style.display = tree ? "none" : "";
    if (!tree) roofline();
  });
  render();
})(document.getElementById(__ROOT__), __DATA__);
"""


def _memory_data(memory: MemoryEstimate, modules: list[dict[str, Any]]) -> dict[str, Any]:
    """Each module's memory by category into its JSON entry; the peak and its breakdown for the bar."""
    for entry in modules:
        found = memory.modules.get(entry["name"])
        entry["memory"] = None if found is None else {**dataclasses.asdict(found), "total": found.total}
    return {"bytes": memory.peak, "phase": memory.peak_phase, "at_peak": {name: memory.at_peak.get(name, 0) for name in CATEGORIES}}


def _page_data(profile: ModelProfile, root_id: str, memory_bandwidth: Optional[float], memory: Optional[MemoryEstimate]) -> dict[str, Any]:
    document = profile_to_dict(profile)
    timed = profile.summary.forward is not None
    return {
        "id": root_id,
        "modules": document["modules"],
        "metrics": {**METRICS, **(MEMORY_METRIC if memory is not None else {})},
        "default_metric": "latency" if timed else "flops",
        "peak_flops": profile.tree_peak_flops,
        "memory_bandwidth": memory_bandwidth,
        "memory_peak": _memory_data(memory, document["modules"]) if memory is not None else None,
        "memory_colours": _MEMORY_COLOURS,
    }


def _memory_note(memory: Optional[MemoryEstimate], device: Optional[DeviceSpec]) -> str:
    """The estimate's peak, what was alive at it (the bar's legend) and, on a device with a memory size, whether it fits."""
    if memory is None:
        return ""
    what = f"a training step ({html.escape(memory.optimizer or '')})" if memory.mode == "training" else "inference"
    legend = " ".join(
        f'<span style="color:{_MEMORY_COLOURS[name]}">&#9632;</span> {name.replace("_", " ")} {html.escape(format_bytes(memory.at_peak[name]))}'
        for name in CATEGORIES if memory.at_peak.get(name)
    )
    fits = ""
    if device is not None and device.memory_bytes:
        fits = f"; {'fits' if memory.fits(device) else 'does NOT fit'} on {html.escape(device.name)} ({memory.needed() / device.memory_bytes:.0%} of {html.escape(format_bytes(device.memory_bytes))})"
    return (f'<div class="note memory-note">Memory of {what}, estimated on fake tensors: peak {html.escape(format_bytes(memory.peak))} '
            f"in the {html.escape(memory.peak_phase)}{fits}. At the peak: {legend}</div><div class=\"membar\"></div>")


def profile_to_html(profile: ModelProfile, memory_bandwidth: Optional[float] = None, fragment: bool = False,
                    memory: Optional[MemoryEstimate] = None) -> str:
    """The report as a page (or, with ``fragment``, as an element for a notebook cell).

    ``memory_bandwidth`` (bytes/s) sets the roofline's slanted roof; by default it is measured on
    the profile's device (:func:`jitflops.timing.peak_flops.memory_bandwidth`) when modules were timed.
    ``memory``: a :func:`jitflops.estimates.memory_footprint` of the same model, shown with the counts.
    """
    summary = profile.summary
    if memory_bandwidth is None and summary.forward is not None:
        memory_bandwidth = peak_memory_bandwidth(summary.device)
    root_id = f"jitflops-{uuid.uuid4().hex[:8]}"
    page = _page_data(profile, root_id, memory_bandwidth, memory)
    data = json.dumps(page).replace("</", "<\\/")
    options = "".join(f'<option value="{key}">{html.escape(label)}</option>' for key, label in page["metrics"].items())
    masked = f"; attention masks discard {summary.masked_out_macs:,} of those MACs (the mask-aware count)" if summary.masked_out_macs else ""
    communication = masked + "".join(
        f"; {html.escape(totals.name)}: {totals.calls} calls, {totals.bytes:,} bytes (bus {totals.bus_bytes:,.0f}) over {'/'.join(map(str, totals.group_sizes))} ranks"
        for totals in summary.collectives
    )
    timing = (
        f"forward {summary.forward.median * 1e3:.3f} ms (median of {len(summary.forward.samples)} runs) on {html.escape(summary.device)}"
        if summary.forward is not None else "not timed: latency, FLOP/s, MFU and the roofline need a timed profile"
    )
    if summary.predicted_s is not None and summary.prediction_device is not None:
        compared = (f", {summary.predicted_to_measured:.2f} x measured" if summary.predicted_to_measured is not None
                    else f" (not compared: measured on {summary.measured_on})" if summary.measured_on is not None else "")
        timing += f"; predicted on {html.escape(summary.prediction_device.name)} (roofline) {summary.predicted_s * 1e3:.3f} ms{html.escape(compared)}"
    body = (
        f'<div class="jf" id="{root_id}"><style>{_STYLE}</style>'
        f"<h2>{html.escape(profile.root.type_name)}: {summary.macs:,} MACs, {summary.flops:,} FLOPs, {summary.params:,} params</h2>"
        f'<div class="note">{timing}. Counted by {html.escape(summary.front_end)}{communication}. Counting convention: {html.escape(profile.convention)}.</div>'
        + _memory_note(memory, summary.prediction_device) +
        '<div class="bar"><label>metric <select class="metric">' + options + "</select></label>"
        '<label>view <select class="view"><option value="tree">module tree</option><option value="roofline">roofline</option></select></label>'
        '<span class="legend"><span class="legend-label"></span><span class="ramp"></span><span class="swatch"></span> not called / no value</span></div>'
        '<div class="tree-view"><div class="crumbs"></div><div class="main"><svg class="icicle" width="900" preserveAspectRatio="none"></svg><div class="details"></div></div>'
        '<div class="note">Box width: the module\'s share of its parent for the metric (FLOPs for FLOP/s and MFU); colour: its value, light to dark. Click a box to focus it and see its details.</div></div>'
        '<div class="roof-view" style="display:none"><svg class="roofline" width="900" height="420"></svg><div class="note roof-note"></div></div>'
        f"<script>{_SCRIPT.replace('__ROOT__', json.dumps(root_id)).replace('__DATA__', data)}</script></div>"
    )
    if fragment:
        return body
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>jitflops: {html.escape(profile.root.type_name)}</title></head><body>{body}</body></html>"


def write_html(profile: ModelProfile, path: str, memory_bandwidth: Optional[float] = None, memory: Optional[MemoryEstimate] = None) -> None:
    write_text(path, profile_to_html(profile, memory_bandwidth, memory=memory))


def _profile_cell(profile: ModelProfile) -> str:
    return profile_to_html(profile, fragment=True)


def _analysis_cell(analysis: JitModelAnalysis) -> str:
    from ..profiling.profile import profile_of_analysis

    return profile_to_html(profile_of_analysis(analysis), fragment=True)


ModelProfile._repr_html_ = _profile_cell  # type: ignore[attr-defined]
JitModelAnalysis._repr_html_ = _analysis_cell  # type: ignore[attr-defined]
