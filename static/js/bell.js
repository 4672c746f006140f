// The bell's unread count, kept current by WS /ws/notifications/live/ (accounts/live.py): a notice
// the worker makes shows without a reload. Words from Django's JavaScript catalog, digits from times.js.
(function () {
  const bell = document.getElementById("bell");
  if (!bell) return;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/ws/notifications/live/`;
  const { number } = window.portalFormat;

  function span(text, className, hidden) {
    const element = document.createElement("span");
    element.textContent = text;
    if (className) element.className = className;
    if (hidden) element.setAttribute("aria-hidden", "true");
    return element;
  }

  // The page's own icon (templates/includes/bell_icon.svg), not an emoji: without an emoji font it is a box.
  const iconDrawn = bell.querySelector(".bell-icon");

  function render(unread) {
    const icon = iconDrawn.cloneNode(true);
    if (unread > 0) {
      const words = ngettext("Notifications: %(count)s unread", "Notifications: %(count)s unread", unread);
      bell.replaceChildren(icon, span(number(unread), "bell-count", true),
        span(interpolate(words, { count: number(unread) }, true), "visually-hidden"));
    } else {
      bell.replaceChildren(icon, span(gettext("Notifications"), "visually-hidden"));
    }
    bell.dataset.unread = String(unread);
  }

  let delay = 1000;
  function connect() {
    const socket = new WebSocket(url);
    socket.onopen = () => { delay = 1000; };
    socket.onmessage = (event) => render(JSON.parse(event.data).unread);
    socket.onclose = (event) => {
      if (event.code === 4401) return;  // signed out in another tab: nothing to count
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 60000);
    };
  }
  connect();
})();
