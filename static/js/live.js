// Live run page: replaces the leaderboard and the pace figures with each snapshot the portal pushes.
// Words come from Django's JavaScript catalog (gettext, /jsi18n/), numbers and times from times.js.
(function () {
  const root = document.getElementById("live");
  if (!root) return;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/ws/runs/${root.dataset.slug}/live/`;
  const body = document.querySelector("#leaderboard tbody");
  const figure = (id, value) => { document.getElementById(id).textContent = value; };
  const { number, timeElement, milestoneMarks } = window.portalFormat;
  const cell = (text) => { const td = document.createElement("td"); td.textContent = text; return td; };

  function render(snapshot) {
    figure("live-rate", number(snapshot.samples_per_second, 1));
    figure("live-peers", number(snapshot.alive_peers));
    figure("live-epoch", number(snapshot.epoch));
    figure("live-loss", number(snapshot.loss, 3));
    if (snapshot.leaderboard.length === 0) {
      const empty = cell(gettext("No contributions yet."));
      empty.colSpan = 7;
      empty.className = "empty";
      const tr = document.createElement("tr");
      tr.append(empty);
      body.replaceChildren(tr);
      return;
    }
    body.replaceChildren(...snapshot.leaderboard.map((row) => {
      const tr = document.createElement("tr");
      tr.dataset.name = row.name;
      const name = document.createElement("td");
      const link = document.createElement("a");
      link.href = row.profile_url;
      link.textContent = row.name;
      name.append(link, ...milestoneMarks(row.milestones));
      const lastSeen = document.createElement("td");
      if (row.last_seen) lastSeen.append(timeElement(row.last_seen)); else lastSeen.textContent = "—";
      tr.append(cell(number(row.rank)), name, cell(number(row.samples)), cell(number(row.credit)),
        cell(`${number(Math.round(row.share * 100))}%`), cell(number(row.machines)), lastSeen);
      return tr;
    }));
    root.dataset.updated = String(Date.now());
  }

  let delay = 1000;
  function connect() {
    const socket = new WebSocket(url);
    socket.onopen = () => { delay = 1000; root.classList.add("connected"); };
    socket.onmessage = (event) => {
      const snapshot = JSON.parse(event.data);
      render(snapshot);
      // charts.js appends the snapshot's figures to the run's charts.
      root.dispatchEvent(new CustomEvent("run:snapshot", { detail: snapshot, bubbles: true }));
    };
    socket.onclose = (event) => {
      root.classList.remove("connected");
      if (event.code === 4404) return;  // this viewer may not (or no longer) see the run: asking again changes nothing
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
