// Open a results file in the page: read it here, post it, show the HTML the server draws.
for (const input of document.querySelectorAll("input[type=file][data-post]")) {
  input.addEventListener("change", async () => {
    const file = input.files[0];
    if (!file) return;
    const r = await fetch(input.dataset.post, {
      method: "POST", body: await file.text(),
      headers: {"Content-Type": "application/json", "HX-Request": "true"}});
    document.getElementById(input.dataset.target).innerHTML = await r.text();
  });
}
