// The usage page's charts, drawn with the plotly.js the portal serves itself (no CDN),
// from the report embedded in the page. The tables below them hold the same figures.
(function () {
  "use strict";
  const Plotly = window.Plotly; // plotly.min.js, loaded just before: a plain script
  const report = JSON.parse(document.getElementById("usage-data").textContent);
  const config = { displaylogo: false, responsive: true };
  const hoursAxis = { title: { text: "GPU-hours" }, rangemode: "tozero", exponentformat: "none" };
  // Plotly reads a few HTML tags in labels: show stored names as text, never as markup.
  const text = (name) =>
    String(name).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

  const days = report.by_day.map((d) => d.day);
  const perModel = report.models.map((model) => ({
    type: "bar",
    name: text(model),
    x: days,
    y: report.by_day.map((d) => d.gpu_hours[model] || 0),
  }));
  const cohorts = Object.keys(report.by_cohort);
  const users = report.top_users.slice().reverse(); // the largest on top
  Promise.all([
    Plotly.newPlot(
      "usage-by-day",
      perModel,
      {
        title: { text: "GPU-hours per day, by model" },
        barmode: "stack",
        showlegend: true, // even for one model: the legend names it
        yaxis: hoursAxis,
      },
      config,
    ),
    cohorts.length
      ? Plotly.newPlot(
          "usage-by-cohort",
          [{ type: "bar", x: cohorts.map(text), y: cohorts.map((c) => report.by_cohort[c]) }],
          { title: { text: "By cohort" }, yaxis: hoursAxis },
          config,
        )
      : document.getElementById("usage-by-cohort").remove(), // no cohorts: the table says so
    Plotly.newPlot(
      "usage-by-user",
      [
        {
          type: "bar",
          orientation: "h",
          y: users.map((u) => text(u.user)),
          x: users.map((u) => u.gpu_hours),
        },
      ],
      { title: { text: "Top users" }, xaxis: hoursAxis, margin: { l: 120 } },
      config,
    ),
  ]).then(() => {
    // For whoever waits on the charts (the browser tests).
    document.getElementById("usage-charts").dataset.drawn = "true";
  });
})();
