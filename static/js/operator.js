// Keyboard focus for the operator pages.
//
// When an answer form is loaded into the inbox's side panel, or comes back from the server
// with errors, move focus there: to the first field with an error, else to the form's
// heading, so keyboard and screen-reader users continue where the content appeared.
document.addEventListener("htmx:afterSwap", (event) => {
  const target = event.detail.target;
  if (!target || target.id !== "answer-panel") {
    return;
  }
  const invalid = target.querySelector("[aria-invalid='true']");
  const errors = target.querySelector("#form-errors");
  const heading = target.querySelector("[data-focus-on-load]");
  const next = invalid || errors || heading;
  if (next) {
    if (next === errors) {
      errors.setAttribute("tabindex", "-1");
    }
    next.focus();
  }
});
