/* Task-level CPU profile report: flamegraphs coloured by task, stacked chart, drill-down.
 * Data comes only from the JSON island #report-data (written with |tojson); every name from it is
 * put into the page with textContent or d3's .text(), never as markup. */
(function () {
  'use strict';

  var data = JSON.parse(document.getElementById('report-data').textContent);
  var frames = data.frames;
  var tasks = data.tasks;
  var MIXED = -1;
  var graphsByKey = {};
  data.graphs.forEach(function (g) { graphsByKey[g.key] = g; });
  var taskIndex = {};
  tasks.forEach(function (t, i) { taskIndex[t.name] = i; });

  var state = { key: null, chart: null, root: null, term: '', inverted: true };
  window.spReport = state; // for tests and for the curious: the current graph and chart

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmtInt(n) { return Math.round(n).toLocaleString('en-US'); }
  function fmtPct(x) { return (100 * x).toFixed(1) + ' %'; }
  function fmtSi(v) {
    var a = Math.abs(v);
    var units = [[1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
    for (var i = 0; i < units.length; i++) {
      if (a >= units[i][0]) return (v / units[i][0]).toPrecision(3) + ' ' + units[i][1];
    }
    return String(Math.round(v * 100) / 100);
  }

  // ------------------------------------------------------------ colours

  function hashName(name) {
    var h = 0;
    for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
    return (h >>> 0) / 4294967295;
  }

  var APPROX = / \[approx\]$/;  // profiler/unwind/hotspot.py APPROXIMATE_MARK

  function taskColor(t, name) {
    if (t === MIXED || t === undefined || !tasks[t]) return data.mixedColor;
    // A light tint of the task's colour keeps the black labels readable; neighbouring frames of one
    // task get slightly different shades so their edges stay visible.
    var base = d3.hsl(tasks[t].color);
    var jitter = (hashName(name) - 0.5) * 0.08;
    // unmatched keeps its own darker grey so it never reads as the light grey of shared frames
    base.l = (tasks[t].name === 'unmatched' ? base.l : Math.max(0.6, Math.min(0.8, base.l + 0.12))) + jitter;
    // a compiled frame named from a borrowed scope (" [approx]", docs/unwinding.md): its inlined callees'
    // time may be in it, so it is drawn washed out
    if (APPROX.test(name)) base.s *= 0.3;
    return base.formatHex();
  }

  // ------------------------------------------------------------ flamegraph

  // Compact [frame, value, task, children, breakdown?, decides?] → d3-flame-graph's {name, value, children}.
  function expand(node) {
    var out = { name: frames[node[0]], value: node[1], task: node[2], children: [] };
    if (node.length > 4 && node[4]) out.breakdown = node[4];
    if (node.length > 5 && node[5]) out.decides = node[5];
    var kids = node[3];
    for (var i = 0; i < kids.length; i++) out.children.push(expand(kids[i]));
    return out;
  }

  function describeTasks(map) {
    var parts = [];
    Object.keys(map).forEach(function (k) {
      var idx = Number(k);
      parts.push([idx === MIXED ? 'not drawn' : tasks[idx].name, map[k]]);
    });
    parts.sort(function (a, b) { return b[1] - a[1]; });
    return parts;
  }

  function unitOf(graph) { return (graph && graph.unit) || 'samples'; }

  function frameText(d) {
    var graph = graphsByKey[state.key];
    var total = graph ? graph.samples : 0;
    var node = d.data;
    var text = node.name + ' — ' + fmtInt(node.value) + ' ' + unitOf(graph);
    if (total) text += ' (' + fmtPct(node.value / total) + ' of this graph)';
    if (node.task === MIXED && node.breakdown && Object.keys(node.breakdown).length) {
      text += ' — shared by: ' + describeTasks(node.breakdown).map(function (p) {
        return p[0] + ' ' + fmtPct(p[1] / node.value);
      }).join(', ');
    } else if (tasks[node.task]) {
      text += ' — task ' + tasks[node.task].name;
    }
    if (node.decides) {
      text += ' — deciding frame for ' + describeTasks(node.decides).map(function (p) {
        return p[0] + ' (' + fmtInt(p[1]) + ')';
      }).join(', ');
    }
    return text;
  }

  function searchMatch(d, term) {
    if (!term) return false;
    var name = d.data.name;
    return typeof name === 'string' && name.toLowerCase().indexOf(term.toLowerCase()) !== -1;
  }

  // Links to the run's speedscope and pprof files beside the page, and what to pick in them for
  // this graph (docs/exports.md); paths and hints come from the payload, put in as text and href.
  function renderExportLinks(key) {
    var box = document.getElementById('graph-exports');
    var exportsData = data.exports;
    box.textContent = '';
    if (!exportsData || !exportsData.files) return;
    var hints = (exportsData.graphs || {})[key] || {};
    box.appendChild(document.createTextNode('Open in other tools: '));
    ['speedscope', 'pprof'].forEach(function (format) {
      var href = exportsData.files[format];
      if (!href) return;
      if (box.childNodes.length > 1) box.appendChild(document.createTextNode(' · '));
      var link = el('a', 'export-link', format + ' file');
      link.setAttribute('href', href);
      link.setAttribute('download', '');
      link.dataset.format = format;
      box.appendChild(link);
      if (hints[format]) box.appendChild(document.createTextNode(' (' + hints[format] + ')'));
    });
  }

  function renderGraph(key) {
    var graph = graphsByKey[key];
    var container = document.getElementById('flame');
    if (state.chart) state.chart.destroy();
    container.textContent = '';
    state.key = key;
    state.chart = null;
    var select = document.getElementById('graph-select');
    if (select.value !== key) select.value = key;
    var info = document.getElementById('graph-info');
    if (!graph) { info.textContent = 'no samples in this report'; return; }
    var infoText = graph.title + ': ' + fmtInt(graph.samples) + ' ' + unitOf(graph) + ' in ' + fmtInt(graph.stacks) + ' distinct stacks';
    if (graph.droppedStacks) {
      infoText += '; the ' + fmtInt(graph.droppedStacks) + ' smallest stacks (' + fmtInt(graph.droppedSamples) +
        ' ' + unitOf(graph) + ') are drawn as one frame: raise --max-stacks (now ' + data.maxStacks + ') to see them';
    }
    info.textContent = infoText;
    renderExportLinks(key);
    if (!graph.samples) { container.appendChild(el('p', 'empty', 'no ' + unitOf(graph))); return; }
    var width = Math.max(600, container.clientWidth || 1100);
    var chart = flamegraph()
      .width(width)
      .cellHeight(18)
      .minFrameSize(1)
      .transitionDuration(250)
      .sort(false)
      .inverted(state.inverted)
      .title('')
      .setSearchMatch(searchMatch)
      .setColorMapper(function (d) {
        return d.highlight ? '#e600e6' : taskColor(d.data.task, d.data.name);
      })
      .setLabelHandler(frameText)
      .setDetailsHandler(function (text) {
        var details = document.getElementById('flame-details');
        details.textContent = text || 'Hover a frame for its samples and task; click to zoom.';
      })
      .setSearchHandler(function (results, sum, total) {
        var out = document.getElementById('search-info');
        if (!state.term) { out.textContent = ''; return; }
        out.textContent = results.length + ' frames match "' + state.term + '": ' + fmtInt(sum) + ' of ' +
          fmtInt(total) + ' samples (' + (total ? fmtPct(sum / total) : '0 %') + ')';
      });
    state.root = expand(graph.tree);
    d3.select(container).datum(state.root).call(chart);
    state.chart = chart;
    if (state.term) chart.search(state.term);
    highlightLegend(graph);
  }

  function openGraph(key, scroll) {
    if (!graphsByKey[key]) return;
    renderGraph(key);
    if (scroll) document.getElementById('flamegraphs').scrollIntoView({ behavior: 'auto', block: 'start' });
  }

  function openTask(name) { openGraph('task:' + name, true); }

  // ------------------------------------------------------------ controls and legend

  function buildSelect() {
    var select = document.getElementById('graph-select');
    var groups = [['host', 'hosts (all workload PIDs merged)'], ['pid', 'workload PIDs'],
      ['task', 'task drill-down'], ['unmatched', 'unmatched'],
      ['offcpu-task', 'off-CPU per task (width: ms blocked)'], ['offcpu-pid', 'off-CPU per PID (width: ms blocked)']];
    groups.forEach(function (group) {
      var members = data.graphs.filter(function (g) { return g.kind === group[0]; });
      if (!members.length) return;
      var optgroup = document.createElement('optgroup');
      optgroup.label = group[1];
      members.forEach(function (g) {
        var option = new Option(g.title + ' (' + fmtInt(g.samples) + ')', g.key);
        optgroup.appendChild(option);
      });
      select.appendChild(optgroup);
    });
    select.addEventListener('change', function () { renderGraph(select.value); });
  }

  function highlightLegend(graph) {
    var items = document.querySelectorAll('#legend .legend-item');
    items.forEach(function (item) {
      var active = graph && graph.kind !== 'host' && graph.kind !== 'pid' &&
        graph.key === 'task:' + item.getAttribute('data-task');
      item.classList.toggle('active', active);
    });
  }

  function buildLegend() {
    var legend = document.getElementById('legend');
    tasks.forEach(function (t) {
      var graph = graphsByKey['task:' + t.name];
      var button = el('button', 'legend-item');
      button.type = 'button';
      button.setAttribute('data-task', t.name);
      button.title = 'open the drill-down flamegraph of ' + t.name;
      var swatch = el('span', 'swatch');
      swatch.style.background = t.color;
      button.appendChild(swatch);
      button.appendChild(document.createTextNode(t.name + (graph ? ' · ' + fmtInt(graph.samples) : '')));
      if (graph && !graph.samples) button.classList.add('empty');
      button.addEventListener('click', function () { openTask(t.name); });
      legend.appendChild(button);
    });
    var mixed = el('span', 'legend-item static');
    var swatch = el('span', 'swatch');
    swatch.style.background = data.mixedColor;
    mixed.appendChild(swatch);
    mixed.appendChild(document.createTextNode('shared by several tasks'));
    legend.appendChild(mixed);
  }

  function wireLinks() {
    document.querySelectorAll('.task-link').forEach(function (button) {
      button.addEventListener('click', function () { openTask(button.getAttribute('data-task')); });
    });
    document.querySelectorAll('.pid-link').forEach(function (button) {
      button.addEventListener('click', function () { openGraph(button.getAttribute('data-graph'), true); });
    });
    var search = document.getElementById('flame-search');
    search.addEventListener('input', function () {
      state.term = search.value.trim();
      if (!state.chart) return;
      if (state.term) state.chart.search(state.term);
      else { state.chart.clear(); document.getElementById('search-info').textContent = ''; }
    });
    document.getElementById('flame-reset').addEventListener('click', function () {
      if (state.chart) state.chart.resetZoom();
    });
    var flip = document.getElementById('flame-flip');
    flip.addEventListener('change', function () {
      state.inverted = flip.checked;
      if (state.key) renderGraph(state.key);
    });
  }

  // ------------------------------------------------------------ stacked bars

  function buildChart() {
    var host = document.getElementById('stacked-chart');
    host.textContent = '';
    var bars = data.chart.bars;
    if (!bars.length) { host.appendChild(el('p', 'note', 'no per-process task rows')); return; }
    var names = tasks.map(function (t) { return t.name; });
    var rows = bars.map(function (b) {
      var row = { label: b.label, host: b.host, pid: b.pid };
      names.forEach(function (n) { row[n] = b.values[n] || 0; });
      return row;
    });
    var series = d3.stack().keys(names)(rows);
    var margin = { top: 8, right: 24, bottom: 28, left: 220 };
    var width = Math.max(600, host.clientWidth || 1000);
    var barHeight = 26;
    var height = margin.top + margin.bottom + rows.length * (barHeight + 8);
    var max = d3.max(rows, function (r) { return d3.sum(names, function (n) { return r[n]; }); }) || 1;
    var x = d3.scaleLinear().domain([0, max]).nice().range([margin.left, width - margin.right]);
    var y = d3.scaleBand().domain(rows.map(function (r, i) { return i; }))
      .range([margin.top, height - margin.bottom]).padding(0.22);
    var svg = d3.select(host).append('svg').attr('width', width).attr('height', height)
      .attr('class', 'stacked');
    svg.append('g').selectAll('g').data(series).join('g')
      .attr('fill', function (s) { return tasks[taskIndex[s.key]].color; })
      .attr('data-task', function (s) { return s.key; })
      .selectAll('rect').data(function (s) { return s.map(function (p) { p.key = s.key; return p; }); }).join('rect')
      .attr('x', function (p) { return x(p[0]); })
      .attr('y', function (p, i) { return y(i); })
      .attr('width', function (p) { return Math.max(0, x(p[1]) - x(p[0])); })
      .attr('height', y.bandwidth())
      .on('click', function (event, p) { openTask(p.key); })
      .append('title').text(function (p) {
        var total = d3.sum(names, function (n) { return p.data[n]; });
        return p.data.label + ' — ' + p.key + ': ' + fmtSi(p[1] - p[0]) + ' ' + data.chart.unit +
          (total ? ' (' + fmtPct((p[1] - p[0]) / total) + ')' : '');
      });
    svg.append('g').attr('class', 'axis').attr('transform', 'translate(0,' + (height - margin.bottom) + ')')
      .call(d3.axisBottom(x).ticks(Math.max(2, Math.floor(width / 120))).tickFormat(fmtSi));
    svg.append('g').attr('class', 'bar-labels').selectAll('text').data(rows).join('text')
      .attr('x', margin.left - 8)
      .attr('y', function (r, i) { return y(i) + y.bandwidth() / 2; })
      .attr('dy', '0.35em').attr('text-anchor', 'end')
      .text(function (r) { return r.label.length > 34 ? r.label.slice(0, 33) + '…' : r.label; })
      .on('click', function (event, r) { openGraph('pid:' + r.host + ':' + r.pid, true); })
      .append('title').text(function (r) { return r.label + ' — open its flamegraph'; });
  }


  // ------------------------------------------------------------ tasks over time

  function timeValue(series, unit, i) {
    var values = series[unit];
    var v = values ? values[i] : null;
    return v === null || v === undefined ? 0 : v;
  }

  function timeUnitText(unit, v) {
    if (unit === 'share') return fmtPct(v);
    if (unit === 'cycles') return fmtSi(v) + ' cycles';
    return fmtInt(v) + ' samples';
  }

  // One stacked step chart per host: x = seconds into the window, each interval drawn over its
  // whole width; y = the chosen unit. Series are the host's tasks with samples.
  function drawHostTime(container, h, unit) {
    var block = el('div', 'time-host');
    block.setAttribute('data-host', h.host);
    block.appendChild(el('h3', null, 'host ' + h.host));
    var legend = el('div', 'legend');
    h.series.forEach(function (s) {
      var item = el('span', 'legend-item static');
      var swatch = el('span', 'swatch');
      swatch.style.background = tasks[s.task].color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(tasks[s.task].name));
      legend.appendChild(item);
    });
    block.appendChild(legend);
    container.appendChild(block);
    var hasCycles = h.series.some(function (s) { return s.cycles; });
    var use = unit === 'cycles' && !hasCycles ? 'share' : unit;
    if (use !== unit) block.appendChild(el('p', 'note', 'no counters timeline on this host: share of samples shown'));
    var n = h.totals.length;
    var keys = h.series.map(function (s, k) { return k; });
    var rows = [];
    for (var i = 0; i <= n; i++) {  // one extra row closes the last step at the window's end
      var row = {};
      h.series.forEach(function (s, k) { row[k] = timeValue(s, use, Math.min(i, n - 1)); });
      rows.push(row);
    }
    var stacked = d3.stack().keys(keys)(rows);
    var margin = { top: 8, right: 24, bottom: 34, left: 64 };
    var width = Math.max(600, container.clientWidth || 1000);
    var height = 220;
    var end = Math.max(h.duration, 1e-9);
    var x = d3.scaleLinear().domain([0, end]).range([margin.left, width - margin.right]);
    var highest = stacked.length ? d3.max(stacked[stacked.length - 1], function (p) { return p[1]; }) : 0;
    var top = use === 'share' ? 1 : (highest || 1);
    var y = d3.scaleLinear().domain([0, top]).nice().range([height - margin.bottom, margin.top]);
    var xAt = function (i) { return x(Math.min(i * h.interval, end)); };
    var svg = d3.select(block).append('svg').attr('width', width).attr('height', height)
      .attr('class', 'time-chart-svg');
    var shade = data.timeline.window;
    if (shade) {
      svg.append('rect').attr('class', 'subwindow')
        .attr('x', x(Math.min(shade.from, end)))
        .attr('width', Math.max(0, x(Math.min(shade.to, end)) - x(Math.min(shade.from, end))))
        .attr('y', margin.top).attr('height', height - margin.top - margin.bottom)
        .append('title').text('sub-window of the tables: ' + shade.from + '–' + shade.to + ' s');
    }
    var area = d3.area().curve(d3.curveStepAfter)
      .x(function (p, i) { return xAt(i); })
      .y0(function (p) { return y(p[0]); })
      .y1(function (p) { return y(p[1]); });
    svg.append('g').selectAll('path').data(stacked).join('path')
      .attr('class', 'series')
      .attr('data-task', function (s) { return tasks[h.series[s.key].task].name; })
      .attr('fill', function (s) { return tasks[h.series[s.key].task].color; })
      .attr('d', area)
      .on('click', function (event, s) { openTask(tasks[h.series[s.key].task].name); })
      .append('title').text(function (s) {
        var series = h.series[s.key];
        var total = d3.sum(series.samples);
        return tasks[series.task].name + ': ' + fmtInt(total) + ' samples over the window';
      });
    svg.append('g').attr('class', 'axis').attr('transform', 'translate(0,' + (height - margin.bottom) + ')')
      .call(d3.axisBottom(x).ticks(Math.max(2, Math.floor(width / 90))));
    svg.append('g').attr('class', 'axis').attr('transform', 'translate(' + margin.left + ',0)')
      .call(d3.axisLeft(y).ticks(5).tickFormat(use === 'share' ? d3.format('.0%') : fmtSi));
    svg.append('text').attr('class', 'axis-label').attr('x', width - margin.right).attr('y', height - 4)
      .attr('text-anchor', 'end').text('seconds into the window (intervals of ' + h.interval + ' s)');
    var cursor = svg.append('line').attr('class', 'cursor').attr('y1', margin.top)
      .attr('y2', height - margin.bottom).style('display', 'none');
    var details = el('p', 'details time-details', 'Hover the chart for one interval.');
    block.appendChild(details);
    svg.on('mousemove', function (event) {
      var px = d3.pointer(event)[0];
      var i = Math.floor(x.invert(px) / h.interval);
      if (i < 0 || i >= n) { cursor.style('display', 'none'); return; }
      cursor.style('display', null).attr('x1', px).attr('x2', px);
      var parts = h.series.map(function (s) { return [tasks[s.task].name, timeValue(s, use, i), s.share[i]]; })
        .filter(function (p) { return p[1] > 0; })
        .sort(function (a, b) { return b[1] - a[1]; });
      details.textContent = (i * h.interval) + '–' + Math.min((i + 1) * h.interval, end) + ' s, ' +
        fmtInt(h.totals[i]) + ' samples: ' + (parts.map(function (p) {
          return p[0] + ' ' + timeUnitText(use, p[1]) + (use !== 'share' && p[2] !== null ? ' (' + fmtPct(p[2]) + ')' : '');
        }).join(', ') || 'no samples');
    });
  }

  function buildTimeChart() {
    var container = document.getElementById('time-chart');
    if (!container || !data.timeline || !data.timeline.hosts.length) return;
    var select = document.getElementById('time-unit');
    var anyCycles = data.timeline.hosts.some(function (h) { return h.series.some(function (s) { return s.cycles; }); });
    if (!anyCycles) {
      select.querySelector('option[value=cycles]').remove();
    }
    function draw() {
      container.textContent = '';
      data.timeline.hosts.forEach(function (h) { drawHostTime(container, h, select.value); });
      state.timeUnit = select.value;
    }
    select.addEventListener('change', draw);
    draw();
  }

  // ------------------------------------------------------------ the profiler's own footprint

  function lineChart(container, title, t, values, format) {
    var box = el('div', 'overhead-box');
    box.appendChild(el('div', 'note', title));
    container.appendChild(box);
    var width = 360, height = 120;
    var margin = { top: 6, right: 12, bottom: 22, left: 48 };
    var points = t.map(function (v, i) { return [v, values[i]]; }).filter(function (p) { return p[1] !== null; });
    var x = d3.scaleLinear().domain([0, d3.max(t) || 1]).range([margin.left, width - margin.right]);
    var y = d3.scaleLinear().domain([0, d3.max(points, function (p) { return p[1]; }) || 1]).nice()
      .range([height - margin.bottom, margin.top]);
    var svg = d3.select(box).append('svg').attr('width', width).attr('height', height).attr('class', 'overhead-svg');
    svg.append('path').attr('class', 'line').datum(points)
      .attr('d', d3.line().x(function (p) { return x(p[0]); }).y(function (p) { return y(p[1]); }));
    svg.append('g').attr('class', 'axis').attr('transform', 'translate(0,' + (height - margin.bottom) + ')')
      .call(d3.axisBottom(x).ticks(4));
    svg.append('g').attr('class', 'axis').attr('transform', 'translate(' + margin.left + ',0)')
      .call(d3.axisLeft(y).ticks(3).tickFormat(format));
  }

  function buildOverheadChart() {
    var container = document.getElementById('overhead-chart');
    if (!container || !data.overhead || !data.overhead.length) return;
    container.textContent = '';
    data.overhead.forEach(function (o) {
      lineChart(container, o.host + ': profiler RSS (MiB) over seconds into the window', o.t, o.rssMiB,
        function (v) { return String(v); });
      lineChart(container, o.host + ': profiler CPU (% of one core)', o.t, o.cpuPercent,
        function (v) { return v + ' %'; });
    });
  }

  // ------------------------------------------------------------ start

  buildSelect();
  buildLegend();
  wireLinks();
  buildChart();
  buildTimeChart();
  buildOverheadChart();
  if (data.defaultGraph) renderGraph(data.defaultGraph);
  else document.getElementById('graph-info').textContent = 'no stacks in this report';
})();
