// The board across all runs, live: replaces its rows with each snapshot WS /ws/leaderboard/live/ pushes
// (at most twice a second). Words come from Django's JavaScript catalog, numbers and times from times.js.
(function () {
  const root = document.getElementById("board-live");
  if (!root) return;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const query = new URLSearchParams({ by: root.dataset.by, window: root.dataset.window });
  const url = `${scheme}://${location.host}/ws/leaderboard/live/?${query}`;
  const body = document.querySelector("#board tbody");
  const { number, timeElement, milestoneMarks } = window.portalFormat;
  const cell = (text) => { const td = document.createElement("td"); td.textContent = text; return td; };

  function row(entry) {
    const tr = document.createElement("tr");
    tr.dataset.name = entry.name;
    const name = document.createElement("td");
    const link = document.createElement("a");
    link.href = entry.profile_url;
    link.textContent = entry.name;
    name.append(link, ...milestoneMarks(entry.milestones));
    const lastSeen = document.createElement("td");
    if (entry.last_seen) lastSeen.append(timeElement(entry.last_seen)); else lastSeen.textContent = "—";
    const seconds = interpolate(gettext("%(seconds)s s"), { seconds: number(entry.compute_seconds) }, true);
    tr.append(cell(number(entry.rank)), name, cell(number(entry.credit)), cell(number(entry.recent_average_credit)),
      cell(`${number(Math.round(entry.share * 100))}%`), cell(seconds), cell(number(entry.machines)), lastSeen);
    return tr;
  }

  function render(snapshot) {
    if (snapshot.leaderboard.length === 0) {
      const empty = cell(gettext("No contributions yet."));
      empty.colSpan = 8;
      empty.className = "empty";
      const tr = document.createElement("tr");
      tr.append(empty);
      body.replaceChildren(tr);
    } else {
      body.replaceChildren(...snapshot.leaderboard.map(row));
    }
    root.dataset.updated = String(Date.now());
  }

  let delay = 1000;
  function connect() {
    const socket = new WebSocket(url);
    socket.onopen = () => { delay = 1000; root.classList.add("connected"); };
    socket.onmessage = (event) => render(JSON.parse(event.data));
    socket.onclose = () => {
      root.classList.remove("connected");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
