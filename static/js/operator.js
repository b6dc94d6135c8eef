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

// The cancellation confirmation opens in the task page's cancel panel: move focus to its
// heading, so the keyboard continues where it appeared.
document.addEventListener("htmx:afterSwap", (event) => {
  const target = event.detail.target;
  if (target && target.id === "cancel-panel") {
    const heading = target.querySelector("[data-focus-on-load]");
    if (heading) {
      heading.focus();
    }
  }
});

// A form marked data-swap-400 shows the server's refusal (400, e.g. a required note left
// out) in place of the form: htmx leaves 4xx responses unswapped unless told.
document.addEventListener("htmx:beforeSwap", (event) => {
  const element = event.detail.requestConfig && event.detail.requestConfig.elt;
  if (event.detail.xhr.status === 400 && element && element.closest("[data-swap-400]")) {
    event.detail.shouldSwap = true;
    event.detail.isError = false;
  }
});

// An effect's settling form replaced by its confirmation, or sent back with an error: move
// focus to the error, else to the confirmation's heading.
document.addEventListener("htmx:afterSettle", (event) => {
  const retarget = event.detail.xhr && event.detail.xhr.getResponseHeader("HX-Retarget");
  if (!retarget || !retarget.startsWith("#reconcile-")) {
    return;
  }
  const form = document.querySelector(retarget);
  const next = form && (form.querySelector("[aria-invalid='true']") || form.querySelector("[data-focus-on-load]"));
  if (next) {
    next.focus();
  }
});

// A refresh replaces the task page's and the list's regions; sections the operator opened
// (the journal, an event's detail) stay open. Every such <details> has a stable id.
let openDetails = [];
document.addEventListener("htmx:beforeSwap", (event) => {
  const target = event.detail.target;
  openDetails = target
    ? [...target.querySelectorAll("details[open][id]")].map((el) => el.id)
    : [];
});
document.addEventListener("htmx:afterSwap", () => {
  for (const id of openDetails) {
    const details = document.getElementById(id);
    if (details) {
      details.open = true;
    }
  }
  openDetails = [];
});

// Regions marked data-poll-visible refresh only while the tab is visible: a request they
// start while it is hidden is dropped (the next tick asks again). An hx-trigger filter
// ("every 3s [document.visibilityState === 'visible']") would do the same, but htmx runs
// filters as JavaScript built from a string, which the Content-Security-Policy forbids.
document.addEventListener("htmx:confirm", (event) => {
  const element = event.detail.elt;
  if (document.visibilityState !== "visible" && element && element.hasAttribute("data-poll-visible")) {
    event.preventDefault();
  }
});
