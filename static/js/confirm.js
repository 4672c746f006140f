// Forms with a data-confirm question ask it before they submit (finishing a run, disbanding a team):
// a listener rather than an onsubmit attribute, which the Content-Security-Policy (portal/settings.py) refuses.
(function () {
  "use strict";
  document.addEventListener("submit", (event) => {
    const question = event.target.dataset && event.target.dataset.confirm;
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });
})();
