// The only way this app makes DOM: createElement and textContent. Program data never reaches
// innerHTML, attributes that run code, or a URL other than a checked data: image.

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string,
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function button(label: string, onClick: () => void | Promise<void>): HTMLButtonElement {
  const node = el("button", undefined, label);
  node.type = "button";
  node.addEventListener("click", () => void onClick());
  return node;
}

export function formatSize(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KB", "MB", "GB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

export function formatCount(count: number): string {
  return count.toLocaleString("en-US");
}
