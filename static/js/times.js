// Times and numbers in the reader's locale (the page's lang) and time zone: every <time class="local">
// the server wrote in UTC (runs/templatetags/locale_format.py) is rewritten here, and live.js formats
// what it receives with the same functions, so every board reads alike.
(function () {
  "use strict";
  const locale = document.documentElement.lang || undefined;
  const dateTime = new Intl.DateTimeFormat(locale, { dateStyle: "medium", timeStyle: "short" });
  const numbers = {};

  function formatTime(iso) {
    const date = new Date(iso);
    return Number.isNaN(date.getTime()) ? "—" : dateTime.format(date);
  }

  function formatNumber(value, digits = 0) {
    if (value === null || value === undefined) return "—";
    numbers[digits] = numbers[digits] || new Intl.NumberFormat(locale, { minimumFractionDigits: digits, maximumFractionDigits: digits });
    return numbers[digits].format(value);
  }

  // The digits of a text the code composed ("09:15:30") in the reader's: ০৯:১৫:৩০ in Bengali.
  function formatDigits(text) {
    return String(text).replace(/[0-9]/g, (digit) => formatNumber(Number(digit)));
  }

  function timeElement(iso) {
    const time = document.createElement("time");
    time.className = "local";
    time.dateTime = iso;
    time.textContent = formatTime(iso);
    return time;
  }

  // The badges next to a name on a board, as runs/includes/milestone_marks.html writes them.
  function milestoneMarks(marks) {
    return (marks || []).map((mark) => {
      const span = document.createElement("span");
      const words = mark.measure === "samples"
        ? gettext("Milestone: %(amount)s confirmed samples") : gettext("Milestone: %(amount)s GFLOP of confirmed credit");
      span.className = `milestone milestone-${mark.measure}`;
      span.setAttribute("role", "img");
      span.title = interpolate(words, { amount: formatNumber(mark.threshold) }, true);
      span.setAttribute("aria-label", span.title);
      span.textContent = "★";
      return span;
    });
  }

  window.portalFormat = { time: formatTime, number: formatNumber, digits: formatDigits, timeElement, milestoneMarks };
  for (const time of document.querySelectorAll("time.local")) time.textContent = formatTime(time.dateTime);
})();
