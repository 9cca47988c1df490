/* The campaign page: small multiples of cycles per event per task against a run label (one line per
   series, 95 % error bars), a stacked total per series and IPC. Data from #campaign-data (JSON); every
   name is written with textContent (d3 .text), never as markup. */
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('campaign-data').textContent);
  document.querySelectorAll('.noscript').forEach(function (n) { n.remove(); });
  var TOTAL = data.totalTask;
  var palette = ['#0b5cad', '#cf222e', '#1a7f37', '#9a6700', '#8250df', '#bf3989', '#0a7d8c', '#57606a'];
  var seriesColor = d3.scaleOrdinal(data.seriesValues, palette);
  var W = 320, H = 210, M = { top: 24, right: 14, bottom: 38, left: 58 };
  var si = d3.format('.3~s'), plain = d3.format('.3~g');
  // SI prefixes for large numbers (cycles), plain digits below 1000 (IPC: 0.5, not 500m).
  function fmt(v) { return Math.abs(v) >= 1000 ? si(v) : plain(v); }

  function xKey(p) { return data.numeric ? p.xValue : p.x; }

  function xScale() {
    if (data.numeric) {
      var values = data.points.map(function (p) { return p.xValue; });
      var lo = d3.min(values), hi = d3.max(values);
      if (lo === hi) { lo = lo * 0.9; hi = hi * 1.1 || 1; }
      var pad = (hi - lo) * 0.06;
      return d3.scaleLinear([lo - pad, hi + pad], [M.left, W - M.right]);
    }
    return d3.scalePoint(data.xs, [M.left, W - M.right]).padding(0.5);
  }

  function svgPanel(container, title, cls) {
    var svg = d3.select(container).append('svg')
      .attr('class', 'campaign-panel ' + cls).attr('width', W).attr('height', H)
      .attr('viewBox', '0 0 ' + W + ' ' + H);
    svg.append('text').attr('class', 'panel-title').attr('x', M.left).attr('y', 14).text(title);
    return svg;
  }

  function axes(svg, x, y, yLabel) {
    var xAxis = data.numeric ? d3.axisBottom(x).ticks(4).tickFormat(fmt) : d3.axisBottom(x);
    svg.append('g').attr('class', 'axis x').attr('transform', 'translate(0,' + (H - M.bottom) + ')').call(xAxis);
    svg.append('g').attr('class', 'axis y').attr('transform', 'translate(' + M.left + ',0)')
      .call(d3.axisLeft(y).ticks(5).tickFormat(fmt));
    svg.append('text').attr('class', 'axis-label').attr('x', (M.left + W - M.right) / 2).attr('y', H - 4)
      .attr('text-anchor', 'middle').text(data.by);
    svg.append('text').attr('class', 'axis-label').attr('transform', 'rotate(-90)')
      .attr('x', -(M.top + H - M.bottom) / 2).attr('y', 12).attr('text-anchor', 'middle').text(yLabel);
  }

  // One panel: per series, a line through the mean of each level's runs, every run's point and error bar.
  function linePanel(container, title, points, value, interval, yLabel, cls) {
    var svg = svgPanel(container, title, cls);
    var x = xScale();
    var top = d3.max(points, function (p) { return value(p) + (interval(p) || 0); }) || 1;
    var y = d3.scaleLinear([0, top], [H - M.bottom, M.top]).nice();
    axes(svg, x, y, yLabel);
    d3.groups(points, function (p) { return p.series; }).forEach(function (entry) {
      var name = entry[0], members = entry[1];
      var color = seriesColor(name);
      var means = d3.rollups(members, function (v) { return d3.mean(v, value); }, xKey)
        .sort(function (a, b) { return d3.ascending(a[0], b[0]) || 0; });
      if (!data.numeric) {
        means.sort(function (a, b) { return data.xs.indexOf(a[0]) - data.xs.indexOf(b[0]); });
      }
      var g = svg.append('g').attr('class', 'series').attr('data-series', name);
      g.append('path').attr('class', 'series-line').attr('fill', 'none').attr('stroke', color).attr('stroke-width', 1.8)
        .attr('d', d3.line().x(function (d) { return x(d[0]); }).y(function (d) { return y(d[1]); })(means));
      members.forEach(function (p) {
        var cx = x(xKey(p)), v = value(p), ci = interval(p);
        var point = g.append('g').attr('class', 'point').attr('data-x', p.x).attr('data-run', p.run);
        if (ci) {
          point.append('line').attr('class', 'error-bar').attr('x1', cx).attr('x2', cx)
            .attr('y1', y(Math.max(0, v - ci))).attr('y2', y(v + ci)).attr('stroke', color);
          [v - ci, v + ci].forEach(function (end) {
            point.append('line').attr('class', 'error-cap').attr('x1', cx - 4).attr('x2', cx + 4)
              .attr('y1', y(Math.max(0, end))).attr('y2', y(Math.max(0, end))).attr('stroke', color);
          });
        }
        point.append('circle').attr('cx', cx).attr('cy', y(v)).attr('r', 3.2).attr('fill', color);
        point.append('title').text(p.run + ' · ' + name + ' · ' + data.by + '=' + p.x + ': ' + fmt(v) +
          (ci ? ' ± ' + fmt(ci) : '') + (p.estimated ? ' (estimated cycles)' : ''));
      });
    });
    return svg;
  }

  function legend() {
    var box = d3.select('#series-legend');
    data.seriesValues.forEach(function (name) {
      var item = box.append('span').attr('class', 'legend-item');
      item.append('span').attr('class', 'swatch').style('background', seriesColor(name));
      item.append('span').text(name || '(none)');
    });
  }

  function taskPanels() {
    var container = document.getElementById('task-panels');
    var tasks = data.tasks.concat([TOTAL]);
    tasks.forEach(function (task) {
      var points = data.points.filter(function (p) { return p.task === task && p.cpe !== null; });
      if (!points.length) { return; }
      linePanel(container, task === TOTAL ? 'total (all tasks)' : task, points,
        function (p) { return p.cpe; }, function (p) { return p.ci; }, 'cycles / event', 'task-panel')
        .attr('data-task', task);
    });
    if (!container.querySelector('svg')) {
      d3.select(container).append('p').attr('class', 'note')
        .text('No cycles per event: no run counted events in its window (events.json: none, or 0) or measured cycles.');
    }
  }

  // Per series, stacked bars: each level of the x label, the tasks' mean cycles per event.
  function stackedPanels() {
    var container = document.getElementById('stacked-panels');
    data.seriesValues.forEach(function (name) {
      var points = data.points.filter(function (p) { return p.series === name && p.task !== TOTAL && p.cpe !== null; });
      if (!points.length) { return; }
      var levels = data.xs.filter(function (x) { return points.some(function (p) { return p.x === x; }); });
      var rows = levels.map(function (x) {
        var row = { x: x };
        data.tasks.forEach(function (task) {
          row[task] = d3.mean(points.filter(function (p) { return p.x === x && p.task === task; }),
            function (p) { return p.cpe; }) || 0;
        });
        return row;
      });
      var stack = d3.stack().keys(data.tasks)(rows);
      var svg = svgPanel(container, name || '(none)', 'stacked-panel').attr('data-series', name);
      var x = d3.scaleBand(levels, [M.left, W - M.right]).padding(0.25);
      var top = d3.max(rows, function (r) { return d3.sum(data.tasks, function (t) { return r[t]; }); }) || 1;
      var y = d3.scaleLinear([0, top], [H - M.bottom, M.top]).nice();
      axes(svg, x, y, 'cycles / event');
      stack.forEach(function (layer) {
        var task = layer.key;
        svg.append('g').attr('class', 'layer').attr('data-task', task).attr('fill', data.colors[task] || '#888')
          .selectAll('rect').data(layer).join('rect')
          .attr('x', function (d) { return x(d.data.x); }).attr('width', x.bandwidth())
          .attr('y', function (d) { return y(d[1]); })
          .attr('height', function (d) { return Math.max(0, y(d[0]) - y(d[1])); })
          .append('title').text(function (d) { return task + ' · ' + data.by + '=' + d.data.x + ': ' + fmt(d[1] - d[0]); });
      });
    });
    var keys = d3.select('#task-legend');
    data.tasks.forEach(function (task) {
      var item = keys.append('span').attr('class', 'legend-item');
      item.append('span').attr('class', 'swatch').style('background', data.colors[task] || '#888');
      item.append('span').text(task);
    });
  }

  function ipcPanel() {
    var container = document.getElementById('ipc-panel');
    var points = data.points.filter(function (p) { return p.task === TOTAL && p.ipc !== null; });
    if (!points.length) {
      d3.select(container).append('p').attr('class', 'note')
        .text('Not measured: no run had hardware cycle and instruction counters (cycles estimated from task-clock).');
      return;
    }
    linePanel(container, 'IPC (all tasks)', points, function (p) { return p.ipc; }, function () { return 0; },
      'instructions / cycle', 'ipc-panel');
  }

  legend();
  taskPanels();
  stackedPanels();
  ipcPanel();
  document.body.setAttribute('data-rendered', 'campaign');
})();
