/* The differential flamegraph of `coordinator compare --out`: one tree of both runs' stacks, each frame
   coloured by the change of its share of all samples (B − A), pale when not significant. Data from
   #compare-data (JSON); frame names reach the page only as text. */
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('compare-data').textContent);
  document.querySelectorAll('.noscript').forEach(function (n) { n.remove(); });
  var frames = data.frames;
  var nA = data.samplesA, nB = data.samplesB;
  var SCALE = 1e6;  // width: mean share of the two runs, in millionths (d3-flame-graph sums values)

  function share(count, total) { return total ? count / total : 0; }

  // Compact [frame, a, b, delta, significant, children] → {name, value, a, b, delta, sig, children}.
  function expand(node) {
    var out = {
      name: frames[node[0]], a: node[1], b: node[2], delta: node[3], sig: node[4],
      value: Math.round((share(node[1], nA) + share(node[2], nB)) / 2 * SCALE), children: []
    };
    node[5].forEach(function (child) { out.children.push(expand(child)); });
    return out;
  }

  var root = expand(data.tree);
  var maxDelta = 0;
  (function walk(n) {
    if (n.sig) maxDelta = Math.max(maxDelta, Math.abs(n.delta));
    n.children.forEach(walk);
  })(root);

  function color(node) {
    if (!node.sig || !maxDelta) return '#e1e4e8';
    var strength = 0.25 + 0.75 * Math.min(1, Math.abs(node.delta) / maxDelta);
    return node.delta > 0 ? d3.interpolateRgb('#fde0dd', '#d62728')(strength)
      : d3.interpolateRgb('#deebf7', '#1f77b4')(strength);
  }

  function pct(x) { return (x * 100).toFixed(2) + ' %'; }

  function describe(d) {
    var n = d.data;
    var sign = n.delta > 0 ? '+' : '';
    return n.name + ' — A: ' + n.a + ' samples (' + pct(share(n.a, nA)) + '), B: ' + n.b + ' samples (' +
      pct(share(n.b, nB)) + '), change ' + sign + (n.delta * 100).toFixed(2) + ' pp' +
      (n.sig ? ' (significant)' : ' (within sampling error)');
  }

  var container = document.getElementById('diff-flame-chart');
  if (!nA && !nB) {
    d3.select(container).append('p').attr('class', 'empty').text('no samples in either run');
  } else {
    var chart = flamegraph()
      .width(Math.max(600, container.clientWidth || 1100))
      .cellHeight(18)
      .minFrameSize(1)
      .transitionDuration(250)
      .sort(false)
      .inverted(true)
      .title('')
      .setColorMapper(function (d) { return color(d.data); })
      .setLabelHandler(describe)
      .setDetailsHandler(function (text) {
        document.getElementById('diff-details').textContent = text || 'Hover a frame for its samples in A and B; click to zoom.';
      });
    d3.select(container).datum(root).call(chart);
  }
  document.body.setAttribute('data-rendered', 'compare');
})();
