// The claims page's filter: show only the claims of one source, chapter and status.
// The page (book/claims.md, via manifold_muon_book.claims_page) writes the controls and the table;
// each row carries data-source, data-chapter and data-status. Without this script every claim shows.
document.addEventListener("DOMContentLoaded", () => {
  for (const controls of document.querySelectorAll(".claims-filter")) {
    const table = document.getElementById(controls.dataset.table);
    if (!table) continue;
    const selects = [...controls.querySelectorAll("select[data-filter]")];
    const shown = controls.querySelector(".claims-shown");
    const rows = [...table.tBodies[0].rows];
    const apply = () => {
      let count = 0;
      for (const row of rows) {
        const match = selects.every(s => !s.value || row.dataset[s.dataset.filter] === s.value);
        row.hidden = !match;
        count += match ? 1 : 0;
      }
      if (shown) shown.textContent = `${count} of ${rows.length} claims`;
    };
    for (const select of selects) select.addEventListener("change", apply);
    apply();
  }
});
