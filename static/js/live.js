// Live run page: replaces the leaderboard and the pace figures with each snapshot the portal pushes.
(function () {
  const root = document.getElementById("live");
  if (!root) return;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/ws/runs/${root.dataset.slug}/live/`;
  const body = document.querySelector("#leaderboard tbody");
  const figure = (id, value) => { document.getElementById(id).textContent = value; };
  const cell = (text) => { const td = document.createElement("td"); td.textContent = text; return td; };

  function render(snapshot) {
    figure("live-rate", snapshot.samples_per_second.toFixed(1));
    figure("live-peers", snapshot.alive_peers);
    figure("live-epoch", snapshot.epoch ?? "—");
    figure("live-loss", snapshot.loss === null ? "—" : snapshot.loss.toFixed(3));
    if (snapshot.leaderboard.length === 0) {
      const empty = cell("No contributions yet.");
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
      name.append(link);
      const credit = Math.round(row.credit).toLocaleString();
      tr.append(cell(row.rank), name, cell(row.samples.toLocaleString()), cell(credit),
        cell(`${(row.share * 100).toFixed(1)}%`), cell(row.machines), cell(new Date(row.last_seen).toLocaleTimeString()));
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
    socket.onclose = () => {
      root.classList.remove("connected");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
