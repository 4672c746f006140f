// Charts of a run's monitor series (uPlot, vendored in static/vendor/uplot/), kept live by the
// snapshots live.js receives, and the reusable contribution chart of a volunteer.
//
// Markup (templates/runs/includes/chart_figure.html): a <section data-series-url> holding
// <figure class="chart" data-field data-unit data-digits [data-markers]> with a caption, a
// .chart-plot to draw in and a .chart-latest paragraph: the latest figure as text, rendered by the
// server for readers without JavaScript and rewritten here as live points arrive.
(function () {
  "use strict";

  const HEIGHT = 190;
  const COLORS = { samples_per_second: "#2b6cb0", loss: "#c53030", alive_peers: "#2f855a", global_epoch: "#6b46c1" };
  const MARKER_COLORS = {
    join: "#38a169", leave: "#a0aec0", activated: "#2b6cb0", paused: "#b7791f", resumed: "#2b6cb0",
    finished: "#1d2330", banned: "#c53030", unbanned: "#d53f8c", checkpoint: "#6b46c1",
  };
  // Only fields that the live snapshot has always carried (runs/leaderboard.py run_snapshot).
  const SNAPSHOT_FIELDS = { samples_per_second: "samples_per_second", alive_peers: "alive_peers", loss: "loss", global_epoch: "epoch" };

  // Figures and times in the reader's digits and grouping (static/js/times.js), as the server writes them.
  const utcTime = (seconds) => window.portalFormat.digits(new Date(seconds * 1000).toISOString().slice(11, 19)) + " UTC";
  const figureText = (value, digits) => window.portalFormat.number(value, digits);
  const utcDate = (seconds) => uPlot.tzDate(new Date(seconds * 1000), "Etc/UTC");
  const widthOf = (element) => Math.max(element.clientWidth, 240);
  // Axis times in UTC and 24 hours, as the figures' text reads; with the day when the span needs it.
  const timeLabels = (plot, splits) => {
    const span = splits.length ? splits[splits.length - 1] - splits[0] : 0;
    return splits.map((split) => {
      const iso = new Date(split * 1000).toISOString();
      return span > 86400 ? `${iso.slice(5, 10)} ${iso.slice(11, 16)}` : iso.slice(11, 16);
    });
  };

  // The same words as runs/series.py Chart.latest_text, so that the text reads alike before and after JS.
  function latestText(figure, value, at) {
    const unit = figure.dataset.unit;
    const shown = value === null || value === undefined ? "—" : figureText(value, Number(figure.dataset.digits)) + (unit ? ` ${unit}` : "");
    return interpolate(gettext("Latest: %(figure)s at %(time)s"), { figure: shown, time: utcTime(at) }, true);
  }

  // The chart in words, next to it and part of the plot's accessible name: the span the chart covers
  // and the lowest and highest figures in it, so that a reader who cannot see the curve gets its shape.
  function rangeText(figure, at, values) {
    const known = values.filter((value) => value !== null && value !== undefined);
    if (!known.length) return gettext("No readings in the chart yet.");
    const digits = Number(figure.dataset.digits);
    const unit = figure.dataset.unit ? ` ${figure.dataset.unit}` : "";
    return interpolate(gettext("Since %(start)s: lowest %(lowest)s, highest %(highest)s."), {
      start: utcTime(at[0]),
      lowest: figureText(Math.min(...known), digits) + unit,
      highest: figureText(Math.max(...known), digits) + unit,
    }, true);
  }

  // Vertical lines over the plot at each marker's time: joins, leaves, pauses, bans, checkpoints.
  function markersPlugin(markers) {
    return {
      hooks: {
        draw: [(plot) => {
          const { ctx } = plot;
          const { left, top, width, height } = plot.bbox;
          ctx.save();
          ctx.lineWidth = 1.5 * devicePixelRatio;
          for (const marker of markers) {
            const x = Math.round(plot.valToPos(marker.at, "x", true));
            if (x < left || x > left + width) continue;
            ctx.strokeStyle = MARKER_COLORS[marker.kind] || "#718096";
            ctx.setLineDash(marker.kind === "join" || marker.kind === "leave" ? [3, 3] : []);
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, top + height);
            ctx.stroke();
          }
          ctx.restore();
        }],
      },
    };
  }

  class TimeChart {
    constructor(figure, at, values, markers) {
      this.figure = figure;
      this.field = figure.dataset.field;
      this.data = [Array.from(at), Array.from(values)];
      const element = figure.querySelector(".chart-plot");
      const options = {
        width: widthOf(element),
        height: HEIGHT,
        tzDate: utcDate,
        legend: { show: false },
        scales: { x: { time: true } },
        axes: [{ values: timeLabels }, { size: 56 }],
        series: [{}, { label: figure.querySelector("figcaption").textContent, stroke: COLORS[this.field] || "#2b6cb0",
          width: 2, spanGaps: true, points: { show: false } }],
        plugins: markers ? [markersPlugin(markers)] : [],
      };
      this.plot = new uPlot(options, this.data, element);
      this.range = document.createElement("p");
      this.range.className = "chart-range";
      this.range.id = `chart-${this.field}-range`;
      this.range.textContent = rangeText(figure, this.data[0], this.data[1]);
      figure.append(this.range);
      element.setAttribute("aria-labelledby", `${element.getAttribute("aria-labelledby") || ""} ${this.range.id}`.trim());
      new ResizeObserver(() => this.plot.setSize({ width: widthOf(element), height: HEIGHT })).observe(element);
      figure.dataset.points = String(this.data[0].length);
    }

    append(at, value) {
      const xs = this.data[0];
      // The browser's clock may lag the server's: keep time moving forward, as uPlot needs.
      const x = xs.length && at <= xs[xs.length - 1] ? xs[xs.length - 1] + 0.001 : at;
      xs.push(x);
      this.data[1].push(value ?? null);
      this.plot.setData(this.data);
      this.figure.querySelector(".chart-latest").textContent = latestText(this.figure, value, x);
      this.range.textContent = rangeText(this.figure, this.data[0], this.data[1]);
      this.figure.dataset.points = String(xs.length);
    }
  }

  function markersOf(figure) {
    const source = figure.dataset.markers && document.getElementById(figure.dataset.markers);
    return source ? JSON.parse(source.textContent) : null;
  }

  // Draws every chart of `section` from its series URL; live snapshots then add a point to each.
  async function runCharts(section) {
    const pending = [];
    let charts = null;
    const apply = (snapshot) => {
      const at = Date.now() / 1000;
      for (const chart of charts) chart.append(at, snapshot[SNAPSHOT_FIELDS[chart.field]]);
      section.dataset.snapshots = String(Number(section.dataset.snapshots || 0) + 1);
      section.querySelector("#charts-empty")?.remove();
    };
    // Listen before fetching: a snapshot that arrives meanwhile is drawn after the series.
    document.addEventListener("run:snapshot", (event) => (charts ? apply(event.detail) : pending.push(event.detail)));
    const response = await fetch(section.dataset.seriesUrl, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) throw new Error(`the run's series could not be loaded (HTTP ${response.status})`);
    const series = await response.json();
    charts = Array.from(section.querySelectorAll("figure.chart[data-field]"),
      (figure) => new TimeChart(figure, series.at, series[figure.dataset.field], markersOf(figure)));
    section.runCharts = charts;
    section.dataset.drawn = "true";
    pending.splice(0).forEach(apply);
    return charts;
  }

  // A volunteer's samples (bars) and credit (line) per day from `url`, which answers
  // [{"day": "YYYY-MM-DD", "samples": n, "credit": x}, ...]. Draws into `element` with a caption
  // and the totals as text; returns the uPlot instance (null when there are no days to draw).
  async function contributionChart(element, url) {
    const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) throw new Error(`contributions could not be loaded (HTTP ${response.status})`);
    const days = await response.json();
    const figure = document.createElement("figure");
    figure.className = "chart contribution-chart";
    const caption = document.createElement("figcaption");
    caption.textContent = gettext("Samples and credit per day");
    const plotElement = document.createElement("div");
    plotElement.className = "chart-plot";
    plotElement.setAttribute("role", "img");
    const summary = document.createElement("p");
    summary.className = "chart-latest";
    const samples = days.reduce((sum, day) => sum + day.samples, 0);
    const credit = days.reduce((sum, day) => sum + day.credit, 0);
    const locale = document.documentElement.lang || undefined;
    summary.textContent = days.length
      ? interpolate(ngettext("%(samples)s samples and %(credit)s credit over %(days)s day, the last on %(last)s.",
        "%(samples)s samples and %(credit)s credit over %(days)s days, the last on %(last)s.", days.length), {
        samples: samples.toLocaleString(locale),
        credit: credit.toLocaleString(locale, { maximumFractionDigits: 1 }),
        days: days.length.toLocaleString(locale),
        last: days[days.length - 1].day,
      }, true)
      : gettext("No contributions yet.");
    caption.id = `contribution-caption-${Math.random().toString(36).slice(2)}`;
    summary.id = `${caption.id}-summary`;
    plotElement.setAttribute("aria-labelledby", `${caption.id} ${summary.id}`);
    // No days: the words alone. An empty plot had axes of 1 January 1970, where uPlot's time scale starts.
    figure.append(...(days.length ? [caption, plotElement, summary] : [caption, summary]));
    element.replaceChildren(figure);
    if (!days.length) return null;
    const data = [days.map((day) => Date.parse(`${day.day}T00:00:00Z`) / 1000), days.map((day) => day.samples), days.map((day) => day.credit)];
    const plot = new uPlot({
      width: widthOf(plotElement),
      height: HEIGHT,
      tzDate: utcDate,
      legend: { show: true, live: false },  // names only: a live legend reads "--" until hovered
      // Half a day either side so that the first and last bars show whole; both figures from zero.
      scales: {
        x: { time: true, range: (plot, min, max) => [min - 43200, max + 43200] },
        y: { range: (plot, min, max) => [0, Math.max(max, 1) * 1.1] },
        credit: { range: (plot, min, max) => [0, Math.max(max, 1) * 1.1] },
      },
      axes: [{}, { size: 64, label: gettext("samples") }, { scale: "credit", side: 1, grid: { show: false }, label: gettext("credit") }],
      series: [
        { label: gettext("day") },
        { label: gettext("samples"), stroke: COLORS.samples_per_second, fill: "rgba(43,108,176,.35)", paths: uPlot.paths.bars({ size: [0.7, 40] }) },
        { label: gettext("credit"), scale: "credit", stroke: COLORS.global_epoch, width: 2 },
      ],
    }, data, plotElement);
    new ResizeObserver(() => plot.setSize({ width: widthOf(plotElement), height: HEIGHT })).observe(plotElement);
    return plot;
  }

  // Held-out scores per checkpoint from `section.dataset.evaluationsUrl` (GET /api/v1/runs/{slug}/evaluations):
  // masked-LM accuracy (left axis, %) and perplexity (right axis, log scale) against epochs or
  // tokens seen, each beside the random-init baseline as a dashed line and the word-frequency
  // (unigram) baseline as a dotted one. The table next to the chart
  // (templates/runs/includes/evaluations.html) holds the same figures.
  async function evaluationChart(section) {
    const response = await fetch(section.dataset.evaluationsUrl, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) throw new Error(`the run's evaluations could not be loaded (HTTP ${response.status})`);
    const rows = (await response.json()).filter((row) => row.status === "done");
    const baseline = rows.find((row) => row.kind === "random_init");
    const unigram = rows.find((row) => row.kind === "unigram");
    const points = rows.filter((row) => !row.baseline);
    const figure = section.querySelector("#evaluation-chart");
    const element = figure.querySelector(".chart-plot");
    const axis = section.querySelector("#evaluation-axis");
    const percent = (value) => (value === null || value === undefined ? null : value * 100);
    const dataFor = (field) => {
      const xs = points.map((row) => row[field]);
      const flat = (value) => xs.map(() => value ?? null);
      return [xs, points.map((row) => percent(row.mlm_accuracy)), flat(percent(baseline?.mlm_accuracy)),
        points.map((row) => row.perplexity), flat(baseline?.perplexity),
        flat(percent(unigram?.mlm_accuracy)), flat(unigram?.perplexity)];
    };
    const latest = points[points.length - 1];
    figure.querySelector(".chart-latest").textContent = interpolate(
      gettext("Latest checkpoint (epoch %(epoch)s): masked-LM accuracy %(accuracy)s%, perplexity %(perplexity)s; random init: %(baseline)s%, %(baseline_perplexity)s; word frequencies: %(unigram)s%, %(unigram_perplexity)s."), {
        epoch: latest.epoch, accuracy: percent(latest.mlm_accuracy).toFixed(1), perplexity: latest.perplexity.toFixed(1),
        baseline: baseline ? percent(baseline.mlm_accuracy).toFixed(1) : "—",
        baseline_perplexity: baseline ? baseline.perplexity.toFixed(1) : "—",
        unigram: unigram ? percent(unigram.mlm_accuracy).toFixed(1) : "—",
        unigram_perplexity: unigram ? unigram.perplexity.toFixed(1) : "—",
      }, true);
    let plot = null;
    const draw = () => {
      plot?.destroy();
      plot = new uPlot({
        width: widthOf(element),
        height: HEIGHT,
        legend: { show: true, live: false },  // names only: a live legend reads "--" until hovered
        // Accuracy in percent from 0 to at least 5%, each tick with its sign: an axis fitted to 0-1 drew 0.8%
        // at the top of the chart, as if it were high.
        scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.min(100, Math.max(5, max * 1.25))] }, ppl: { distr: 3 } },
        axes: [{ label: axis.value === "epoch" ? gettext("epoch") : gettext("tokens seen") },
          { size: 56, label: gettext("masked-LM accuracy"), values: (u, ticks) => ticks.map((tick) => `${figureText(tick, 1)}%`) },
          { scale: "ppl", side: 1, grid: { show: false }, size: 64, label: gettext("perplexity") }],
        series: [
          {},
          { label: gettext("masked-LM accuracy"), stroke: COLORS.samples_per_second, width: 2, points: { show: true } },
          { label: gettext("random init"), stroke: COLORS.samples_per_second, width: 1, dash: [6, 4], points: { show: false } },
          { label: gettext("perplexity"), scale: "ppl", stroke: COLORS.loss, width: 2, points: { show: true } },
          { label: gettext("random init"), scale: "ppl", stroke: COLORS.loss, width: 1, dash: [6, 4], points: { show: false } },
          { label: gettext("word frequencies"), stroke: COLORS.samples_per_second, width: 1, dash: [2, 3], points: { show: false } },
          { label: gettext("word frequencies"), scale: "ppl", stroke: COLORS.loss, width: 1, dash: [2, 3], points: { show: false } },
        ],
      }, dataFor(axis.value), element);
      section.dataset.axis = axis.value;
      section.evaluationPlot = plot;
    };
    draw();
    axis.addEventListener("change", draw);
    new ResizeObserver(() => plot.setSize({ width: widthOf(element), height: HEIGHT })).observe(element);
    section.dataset.drawn = "true";
    section.dataset.points = String(points.length);
    return plot;
  }

  window.runCharts = runCharts;
  window.evaluationChart = evaluationChart;
  window.contributionChart = contributionChart;

  document.querySelectorAll("section[data-series-url]").forEach((section) => {
    runCharts(section).catch((error) => { section.dataset.error = error.message; console.warn(error.message); });
  });
  document.querySelectorAll("section[data-evaluations-url]").forEach((section) => {
    evaluationChart(section).catch((error) => { section.dataset.error = error.message; console.warn(error.message); });
  });
  document.querySelectorAll("[data-contribution-url]").forEach((element) => {
    contributionChart(element, element.dataset.contributionUrl).catch((error) => console.warn(error.message));
  });
})();
