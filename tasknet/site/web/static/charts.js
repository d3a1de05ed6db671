/* Three small SVG charts for the web UI, drawn at the container's pixel width.
 *
 * A charting library would be larger than everything else in static/ put
 * together for three fixed shapes (an area over time, horizontal bars, bars
 * with a quota line), so they are drawn here.  Colours come from style.css
 * classes (no style attributes: the page runs under a strict CSP).  Every
 * chart carries role="img" and an aria-label that states its data, and each
 * data mark has a <title> for pointer users.
 */
window.TasknetCharts = (function () {
  "use strict";

  var NS = "http://www.w3.org/2000/svg";

  function svgEl(tag, attrs, text) {
    var node = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (name) { node.setAttribute(name, String(attrs[name])); });
    if (text !== undefined) { node.textContent = text; }
    return node;
  }

  function withTitle(node, text) {
    node.appendChild(svgEl("title", {}, text));
    return node;
  }

  function frame(container, height, label, kind, count) {
    var width = Math.max(240, Math.floor(container.clientWidth || 320));
    var svg = svgEl("svg", {
      width: width, height: height, viewBox: "0 0 " + width + " " + height,
      role: "img", "aria-label": label, "data-chart": kind, "data-points": count,
      class: "chart-svg"
    });
    container.textContent = "";
    container.appendChild(svg);
    return { svg: svg, width: width, height: height };
  }

  // A rounded "nice" upper bound for an axis (1, 1.2, 1.5, 2, … × 10^n).
  function niceMax(value) {
    if (!(value > 0)) { return 1; }
    var power = Math.pow(10, Math.floor(Math.log10(value)));
    var steps = [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10];
    for (var i = 0; i < steps.length; i++) {
      if (value <= steps[i] * power) { return steps[i] * power; }
    }
    return 10 * power;
  }

  // Roughly how wide a label is drawn (12 px system font; CJK is wider).
  function textWidth(text) {
    var w = 0;
    String(text).split("").forEach(function (c) { w += c.charCodeAt(0) > 0x2E80 ? 12 : 7; });
    return w;
  }

  // Time labels on round minutes/hours, as many as fit (at least 3 for any
  // window, evenly spaced), so a 24 h window reads 00:00, 04:00, 08:00 …
  var STEPS = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 14400, 21600, 43200];
  function timeTicks(start, end, room, label) {
    var span = (end - start) / 1000;
    if (!(span > 0)) { return []; }
    var fit = Math.max(2, Math.floor(room / (textWidth(label(new Date(start))) + 24)));
    var step = STEPS[STEPS.length - 1];
    for (var i = 0; i < STEPS.length; i++) { if (span / STEPS[i] <= fit) { step = STEPS[i]; break; } }
    var offset = new Date(start).getTimezoneOffset() * 60;
    var first = Math.ceil((start / 1000 - offset) / step) * step + offset;
    var ticks = [];
    for (var at = first; at * 1000 <= end; at += step) { ticks.push(new Date(at * 1000)); }
    return ticks;
  }

  // A label centred on ``at`` unless that would cross an edge of the chart
  // ("12:00 A" clipped on the right): then it ends (or starts) at the edge.
  function placed(at, width, chartWidth) {
    if (at + width / 2 > chartWidth - 2) { return { x: chartWidth - 2, anchor: "end", from: chartWidth - 2 - width, to: chartWidth - 2 }; }
    if (at - width / 2 < 2) { return { x: 2, anchor: "start", from: 2, to: 2 + width }; }
    return { x: at, anchor: "middle", from: at - width / 2, to: at + width / 2 };
  }

  /* Values over time: options.points = [{t: Date, v: number}], options.format(v)
   * for the axis, options.time(Date) for the x labels. */
  function area(container, options) {
    var points = options.points;
    var f = frame(container, 180, options.label, "area", points.length);
    var max = niceMax(Math.max.apply(null, points.map(function (p) { return p.v; }).concat([0])));
    var left = Math.max(textWidth(options.format(max)), textWidth(options.format(max / 2))) + 12, right = 16, top = 12, bottom = 24;
    var w = f.width - left - right, h = f.height - top - bottom;
    var x = function (i) { return left + (points.length > 1 ? (i * w) / (points.length - 1) : w / 2); };
    var y = function (v) { return top + h - (v / max) * h; };

    [0, 0.5, 1].forEach(function (share) {
      var at = y(max * share);
      f.svg.appendChild(svgEl("line", { x1: left, x2: left + w, y1: at, y2: at, class: "grid" }));
      f.svg.appendChild(svgEl("text", { x: left - 6, y: at + 4, "text-anchor": "end", class: "axis" }, options.format(max * share)));
    });
    if (points.length) {
      var line = points.map(function (p, i) { return (i ? "L" : "M") + x(i).toFixed(1) + " " + y(p.v).toFixed(1); }).join(" ");
      var fill = line + " L" + x(points.length - 1).toFixed(1) + " " + y(0) + " L" + x(0).toFixed(1) + " " + y(0) + " Z";
      f.svg.appendChild(svgEl("path", { d: fill, class: "area-fill" }));
      f.svg.appendChild(svgEl("path", { d: line, class: "area-line", "data-role": "series" }));
      points.forEach(function (p, i) {
        if (p.v > 0) {
          f.svg.appendChild(withTitle(svgEl("circle", { cx: x(i), cy: y(p.v), r: 2.5, class: "area-dot" }),
            options.time(p.t) + ": " + options.format(p.v)));
        }
      });
      var t0 = points[0].t.getTime(), t1 = points[points.length - 1].t.getTime();
      var taken = -Infinity;  // where the last label drawn ends
      timeTicks(t0, t1, w, options.time).forEach(function (tick) {
        var at = left + (t1 > t0 ? ((tick.getTime() - t0) / (t1 - t0)) * w : w / 2);
        f.svg.appendChild(svgEl("line", { x1: at, x2: at, y1: top + h, y2: top + h + 4, class: "grid" }));
        var text = options.time(tick);
        var span = placed(at, textWidth(text), f.width);
        if (span.from < taken + 8) { return; }  // would overlap the previous label
        taken = span.to;
        f.svg.appendChild(svgEl("text", { x: span.x, y: f.height - 6, "text-anchor": span.anchor, class: "axis", "data-role": "time-tick" }, text));
      });
    }
    return f.svg;
  }

  /* Horizontal bars: options.items = [{label, value}], options.format(v). */
  function bars(container, options) {
    var items = options.items;
    var row = 30;
    var f = frame(container, Math.max(1, items.length) * row + 8, options.label, "bars", items.length);
    var labelWidth = Math.min(120, Math.floor(f.width * 0.3));
    var valueWidth = 84;
    var w = Math.max(20, f.width - labelWidth - valueWidth - 8);
    var max = Math.max.apply(null, items.map(function (it) { return it.value; }).concat([1]));
    items.forEach(function (item, i) {
      var top = 4 + i * row;
      var length = Math.max(item.value > 0 ? 2 : 0, (item.value / max) * w);
      f.svg.appendChild(svgEl("text", { x: 0, y: top + 18, class: "label" }, item.label));
      f.svg.appendChild(svgEl("rect", { x: labelWidth, y: top + 4, width: w, height: 18, rx: 3, class: "bar-track" }));
      f.svg.appendChild(withTitle(svgEl("rect", {
        x: labelWidth, y: top + 4, width: length.toFixed(1), height: 18, rx: 3,
        class: "bar-value", "data-role": "series", "data-value": item.value
      }), item.label + ": " + options.format(item.value)));
      f.svg.appendChild(svgEl("text", { x: f.width, y: top + 18, "text-anchor": "end", class: "value" }, options.format(item.value)));
    });
    return f.svg;
  }

  /* Weekly columns against a quota line: options.weeks = [{week, used}],
   * options.quota, options.weekLabel(week), options.quotaLabel. */
  function quota(container, options) {
    var weeks = options.weeks;
    var f = frame(container, 180, options.label, "quota", weeks.length);
    var max = niceMax(Math.max.apply(null, weeks.map(function (wk) { return wk.used; }).concat([options.quota || 0, 1])) * 1.1);
    var number = options.number || String;
    // The axis label's own width: "120,000" is never clipped to ".20000".
    var left = textWidth(number(max)) + 12, right = 8, top = 14, bottom = 24;
    var w = f.width - left - right, h = f.height - top - bottom;
    var y = function (v) { return top + h - (v / max) * h; };
    var slot = w / Math.max(1, weeks.length);
    f.svg.appendChild(svgEl("line", { x1: left, x2: left + w, y1: y(0), y2: y(0), class: "grid" }));
    f.svg.appendChild(svgEl("text", { x: left - 6, y: y(max) + 4, "text-anchor": "end", class: "axis", "data-role": "axis-max" }, number(max)));
    f.svg.appendChild(svgEl("text", { x: left - 6, y: y(0) + 4, "text-anchor": "end", class: "axis" }, number(0)));
    // Week labels that fit: the short form when the long one does not, then every k-th.
    var widest = function (fn) { return Math.max.apply(null, weeks.map(function (wk) { return textWidth(fn(wk.week)); }).concat([0])); };
    var labelOf = options.weekLabel;
    if (options.shortWeekLabel && widest(labelOf) + 6 > slot) { labelOf = options.shortWeekLabel; }
    var every = Math.max(1, Math.ceil((widest(labelOf) + 6) / Math.max(1, slot)));
    var valueTaken = -Infinity;
    weeks.forEach(function (wk, i) {
      var over = options.quota > 0 && wk.used > options.quota;
      var x = left + i * slot + slot * 0.15;
      var height = Math.max(wk.used > 0 ? 2 : 0, y(0) - y(wk.used));
      f.svg.appendChild(withTitle(svgEl("rect", {
        x: x.toFixed(1), y: (y(0) - height).toFixed(1), width: (slot * 0.7).toFixed(1), height: height.toFixed(1),
        class: "week-bar" + (i === weeks.length - 1 ? " current" : "") + (over ? " over" : ""),
        "data-role": "series", "data-value": wk.used
      }), options.weekLabel(wk.week) + ": " + number(wk.used) + " / " + number(options.quota)));
      // A value over its bar only where it fits beside its neighbours'
      // ("31,609" and "20" ran together as "31,60920" on a phone); the bar's
      // title and the chart's label still give every value.
      var valueText = number(wk.used);
      var fits = textWidth(valueText) + 4 <= slot || i === weeks.length - 1;
      if (wk.used > 0 && fits) {
        var value = placed(x + slot * 0.35, textWidth(valueText), f.width);
        if (value.from >= valueTaken + 4) {
          valueTaken = value.to;
          f.svg.appendChild(svgEl("text", { x: value.x, y: Math.max(10, y(0) - height - 4), "text-anchor": value.anchor, class: "value", "data-role": "week-value" }, valueText));
        }
      }
      // Counted from the current week (the last), so it is always labelled.
      if ((weeks.length - 1 - i) % every === 0) {
        var weekText = labelOf(wk.week);
        var where = placed(x + slot * 0.35, textWidth(weekText), f.width);
        f.svg.appendChild(svgEl("text", { x: where.x, y: f.height - 6, "text-anchor": where.anchor, class: "axis", "data-role": "week-label" }, weekText));;
      }
    });
    if (options.quota > 0) {
      var at = y(options.quota);
      f.svg.appendChild(svgEl("line", { x1: left, x2: left + w, y1: at, y2: at, class: "quota-line", "data-role": "quota" }));
      f.svg.appendChild(svgEl("text", { x: left + w, y: at - 4, "text-anchor": "end", class: "axis quota-text" }, options.quotaLabel));
    }
    return f.svg;
  }

  return { area: area, bars: bars, quota: quota };
})();
