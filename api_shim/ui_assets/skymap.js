// A scan's skymap drawn from its stored result (icecube-skyreader's serialization: per `nside-N`, rows
// of [index, llh, ...] with `index` a HEALPix RING pixel): the full sky in Mollweide and a gnomonic
// zoom around the best fit, each pixel's -2 ΔlnL (relative to the best pixel over all nsides, finer
// nsides over coarser) in viridis, the best fit marked, and skyreader's Wilks regions outlined
// (-2 ΔlnL ≤ 1.39: 50 %, ≤ 4.61: 90 %). Drawn by inverse projection: each canvas pixel's direction,
// its pixel at the coarsest nside and, where finer pixels lie inside that one, at the finer nsides, the
// finest found giving its value; no gaps, and nothing else is fetched.
import { el } from "./dom.js";

// ---------------------------------------------------------------- HEALPix, RING scheme
// Górski et al. 2005 (ApJ 622, 759), as healpix_base implements it: pixel centres (eqs. 4-9) and the
// pixel holding a direction. z = cos(theta), phi in radians.

const TWO_PI = 2 * Math.PI;

export function pix2zphi(nside, pix) {
  const npix = 12 * nside * nside;
  const ncap = 2 * nside * (nside - 1);
  if (pix < ncap) { // north polar cap
    const ring = Math.floor((1 + Math.sqrt(1 + 2 * pix)) / 2);
    const iphi = pix + 1 - 2 * ring * (ring - 1);
    return [1 - (ring * ring) / (3 * nside * nside), ((iphi - 0.5) * Math.PI) / (2 * ring)];
  }
  if (pix < npix - ncap) { // equatorial belt
    const ip = pix - ncap;
    const ring = Math.floor(ip / (4 * nside)) + nside;
    const iphi = (ip % (4 * nside)) + 1;
    const shift = (ring + nside) & 1 ? 1 : 0.5;
    return [((2 * nside - ring) * 2) / (3 * nside), ((iphi - shift) * Math.PI) / (2 * nside)];
  }
  const ip = npix - pix; // south polar cap
  const ring = Math.floor((1 + Math.sqrt(2 * ip - 1)) / 2);
  const iphi = 4 * ring + 1 - (ip - 2 * ring * (ring - 1));
  return [-1 + (ring * ring) / (3 * nside * nside), ((iphi - 0.5) * Math.PI) / (2 * ring)];
}

export function pix2ang(nside, pix) {
  const [z, phi] = pix2zphi(nside, pix);
  return [Math.acos(z), phi];
}

export function zphi2pix(nside, z, phi) {
  const za = Math.abs(z);
  let tt = phi * (2 / Math.PI); // in [0, 4) once wrapped
  if (tt < 0 || tt >= 4) tt -= 4 * Math.floor(tt / 4);
  if (za <= 2 / 3) { // equatorial belt
    const t1 = nside * (0.5 + tt);
    const t2 = nside * z * 0.75;
    const jp = Math.floor(t1 - t2); // ascending edge line
    const jm = Math.floor(t1 + t2); // descending edge line
    const ring = nside + 1 + jp - jm; // 1..2 nside + 1, counted from z = 2/3
    const shift = 1 - (ring & 1);
    const nl4 = 4 * nside;
    const ip = (((Math.floor((jp + jm - nside + shift + 1) / 2)) % nl4) + nl4) % nl4;
    return 2 * nside * (nside - 1) + (ring - 1) * nl4 + ip;
  }
  const tp = tt - Math.floor(tt); // polar caps
  const tmp = nside * Math.sqrt(3 * (1 - za));
  const jp = Math.floor(tp * tmp);
  const jm = Math.floor((1 - tp) * tmp);
  const ring = jp + jm + 1; // counted from the nearest pole
  const ip = Math.min(Math.floor(tt * ring), 4 * ring - 1);
  return z > 0 ? 2 * ring * (ring - 1) + ip : 12 * nside * nside - 2 * ring * (ring + 1) + ip;
}

export function ang2pix(nside, theta, phi) {
  return zphi2pix(nside, Math.cos(theta), phi);
}

// ---------------------------------------------------------------- the result

export const LEVELS = [ // skyreader's get_contour_levels, Wilks: -2 ΔlnL for 50 % and 90 %
  { name: "50 %", value: 1.39, colour: [255, 255, 255] },
  { name: "90 %", value: 4.61, colour: [255, 140, 0] },
];

// The result's pixels per nside (Map pixel -> -2 ΔlnL), finest first, and the best fit: the lowest
// llh over all nsides, as skyreader's extract_map finds it.
export function readResult(scanResult) {
  const layers = [];
  let best = null;
  let count = 0;
  for (const [key, part] of Object.entries(scanResult || {})) {
    const nside = Number(part?.metadata?.nside ?? key.replace(/^nside-/, ""));
    const columns = Array.isArray(part?.columns) ? part.columns : ["index", "llh"];
    const at = { index: columns.indexOf("index"), llh: columns.indexOf("llh") };
    if (!Number.isInteger(nside) || nside < 1 || !Array.isArray(part?.data) || at.index < 0 || at.llh < 0) continue;
    const values = new Map();
    let lowest = Infinity;
    for (const row of part.data) {
      if (!Array.isArray(row)) continue;
      const pixel = row[at.index];
      const llh = row[at.llh];
      if (!Number.isInteger(pixel) || pixel < 0 || pixel >= 12 * nside * nside || !Number.isFinite(llh)) continue;
      values.set(pixel, llh);
      lowest = Math.min(lowest, llh);
      if (best === null || llh < best.llh) best = { nside, pixel, llh };
    }
    count += values.size;
    layers.push({ nside, values, best: lowest });
  }
  layers.sort((a, b) => b.nside - a.nside);
  if (best === null) return { layers: [], count: 0, best: null, max: 0 };
  let max = 0;
  for (const layer of layers) {
    for (const [pixel, llh] of layer.values) {
      const value = 2 * (llh - best.llh);
      layer.values.set(pixel, value);
      if (value > max) max = value;
    }
  }
  const [z, phi] = pix2zphi(best.nside, best.pixel);
  best.ra = (phi * 180) / Math.PI;
  best.dec = (Math.asin(z) * 180) / Math.PI;
  return { layers, count, best, max };
}

// The result's pixels as slots (one per pixel of any nside, `values` their -2 ΔlnL) and, per nside
// from the coarsest, each pixel's slot and whether a finer nside has pixels inside it (`deeper`).
function slots(layers) {
  const coarseFirst = layers.slice().reverse();
  const values = new Float32Array(coarseFirst.reduce((n, layer) => n + layer.values.size, 0));
  let next = 0;
  const steps = coarseFirst.map((layer, k) => {
    const npix = 12 * layer.nside * layer.nside;
    const small = npix <= 1 << 20; // up to nside 256: arrays; finer: a Map and a Set
    const step = { nside: layer.nside, slot: small ? new Int32Array(npix).fill(-1) : null,
      map: small ? null : new Map(), deeper: small ? new Uint8Array(npix) : null, set: small ? null : new Set() };
    for (const [pixel, value] of layer.values) {
      values[next] = value;
      if (small) step.slot[pixel] = next++;
      else step.map.set(pixel, next++);
    }
    for (const finer of coarseFirst.slice(k + 1)) {
      for (const pixel of finer.values.keys()) {
        const [z, phi] = pix2zphi(finer.nside, pixel);
        const inside = zphi2pix(layer.nside, z, phi);
        if (small) step.deeper[inside] = 1;
        else step.set.add(inside);
      }
    }
    return step;
  });
  return { values, steps };
}

// The slot in direction (z = sin dec, phi = RA) into found[0], -1 where not scanned, and into found[1]
// the path to it (the finest pixel visited, and how deep): the nsides from the coarsest, going finer only
// where a finer nside has pixels inside this one (nsides are powers of two: a finer pixel lies in one
// coarser pixel), so most of the sky costs one pixel lookup.
function walk(steps, z, phi, found) {
  let slot = -1;
  let path = 0;
  for (let l = 0; l < steps.length; l++) {
    const step = steps[l];
    const pixel = zphi2pix(step.nside, z, phi);
    const here = step.slot !== null ? step.slot[pixel] : (step.map.get(pixel) ?? -1);
    if (here >= 0) slot = here;
    path = pixel * 16 + l;
    if (step.deeper !== null ? step.deeper[pixel] === 0 : !step.set.has(pixel)) break;
  }
  found[0] = slot;
  found[1] = path;
}

// Each canvas pixel's slot (zs[k] = sin dec, NaN off the sky; phis[k] = RA), row by row, into `out`
// (-2 off the sky). Where the pixels RUN apart along a row took the same path, every pixel between them
// did: along a row of constant z (the Mollweide's) a pixel's HEALPix indices only grow with phi, so a
// pixel met twice spans what lies between; in the zoom's few degrees, within a pixel's curvature.
const RUN = 6;
function locate(sky, width, zs, phis, out) {
  const { steps } = sky;
  const a = new Float64Array(2);
  const b = new Float64Array(2);
  for (let k = 0; k < zs.length; k++) {
    if (Number.isNaN(zs[k])) {
      out[k] = -2;
      continue;
    }
    walk(steps, zs[k], phis[k], a);
    out[k] = a[0];
    const end = k + RUN;
    if ((k % width) + RUN >= width || Number.isNaN(zs[end])) continue;
    walk(steps, zs[end], phis[end], b);
    if (a[1] === b[1]) {
      out.fill(a[0], k + 1, end + 1);
    } else {
      for (let i = k + 1; i < end; i++) {
        walk(steps, zs[i], phis[i], a);
        out[i] = a[0];
      }
      out[end] = b[0];
    }
    k = end;
  }
}

// The zoom's half-width, radians: the 90 % region's reach from the best fit with room around it.
function zoomHalfWidth(sky) {
  const { best } = sky;
  const [bz, bphi] = [Math.sin((best.dec * Math.PI) / 180), (best.ra * Math.PI) / 180];
  const bcos = Math.sqrt(1 - bz * bz);
  let reach = 0;
  for (const layer of sky.layers) {
    const radius = Math.sqrt(Math.PI / 3) / layer.nside; // about a pixel's size
    for (const [pixel, value] of layer.values) {
      if (value > LEVELS[1].value) continue;
      const [z, phi] = pix2zphi(layer.nside, pixel);
      const cos = bz * z + bcos * Math.sqrt(1 - z * z) * Math.cos(phi - bphi);
      reach = Math.max(reach, Math.acos(Math.min(1, cos)) + radius);
    }
  }
  const degree = Math.PI / 180;
  return Math.min(Math.max(1.5 * reach, 1 * degree), 30 * degree);
}

// ---------------------------------------------------------------- colours

const VIRIDIS = ("440154 48186a 472d7b 424086 3b528b 33638d 2c728e 26828e 21918c 1fa088 28ae80 3fbc73 " +
  "5ec962 84d44b addc30 d8e219 fde725").split(" ").map((hex) => [0, 2, 4].map((i) => parseInt(hex.slice(i, i + 2), 16)));
const LUT = new Uint8ClampedArray(256 * 3);
for (let i = 0; i < 256; i++) {
  const at = (i / 255) * (VIRIDIS.length - 1);
  const lo = Math.min(Math.floor(at), VIRIDIS.length - 2);
  const f = at - lo;
  for (let c = 0; c < 3; c++) LUT[i * 3 + c] = VIRIDIS[lo][c] * (1 - f) + VIRIDIS[lo + 1][c] * f;
}
const UNSCANNED = [216, 216, 216];
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
// A canvas pixel (r, g, b, opaque) as one 32-bit word: LUT[c..c+2], or unscanned grey for c < 0.
function rgba(c) {
  const [r, g, b] = c < 0 ? UNSCANNED : [LUT[c], LUT[c + 1], LUT[c + 2]];
  return (LITTLE_ENDIAN ? ((255 << 24) | (b << 16) | (g << 8) | r) : ((r << 24) | (g << 16) | (b << 8) | 255)) >>> 0;
}
const INK = "#1b1b1b";

// ---------------------------------------------------------------- projections

const SQRT2 = Math.SQRT2;

// Mollweide, RA 180° at the centre increasing to the left: (RA, dec) radians -> unit coordinates
// x in [-2√2, 2√2], y in [-√2, √2] (north up).
function mollweide(ra, dec) {
  let t = dec;
  for (let i = 0; i < 30 && Math.abs(Math.abs(dec) - Math.PI / 2) > 1e-9; i++) {
    const step = (2 * t + Math.sin(2 * t) - Math.PI * Math.sin(dec)) / (2 + 2 * Math.cos(2 * t));
    t -= step;
    if (Math.abs(step) < 1e-10) break;
  }
  if (Math.abs(Math.abs(dec) - Math.PI / 2) <= 1e-9) t = dec;
  let lon = ra - Math.PI; // -π..π, east of the centre
  lon = ((lon + Math.PI) % TWO_PI + TWO_PI) % TWO_PI - Math.PI;
  return [(-2 * SQRT2 / Math.PI) * lon * Math.cos(t), SQRT2 * Math.sin(t)];
}

// Gnomonic around (ra0, dec0), east to the left: (RA, dec) radians -> tangent-plane (x, y), or null
// on the far hemisphere.
function gnomonic(ra0, dec0, ra, dec) {
  const cosc = Math.sin(dec0) * Math.sin(dec) + Math.cos(dec0) * Math.cos(dec) * Math.cos(ra - ra0);
  if (cosc <= 0) return null;
  const x = (Math.cos(dec) * Math.sin(ra - ra0)) / cosc;
  const y = (Math.cos(dec0) * Math.sin(dec) - Math.sin(dec0) * Math.cos(dec) * Math.cos(ra - ra0)) / cosc;
  return [-x, y];
}

// ---------------------------------------------------------------- drawing

const W = 1000;
const H = 462;
const MOLL = { x: 10, y: 34, w: 640, h: 320 };
const ZOOM = { x: 680, y: 34, size: 310 };
const BAR = { y: 384, h: 12 };
const ZOOM_TOP = 20; // the zoom's colour bar ends here: -2 ΔlnL above it is its brightest colour

// Fills `image` (one panel) with the directions of its pixels (zs: sin dec, NaN off the sky; phis: RA),
// each slot in its colour (`scale`: -2 ΔlnL -> 0..1), then outlines the regions: their pixels with a
// neighbour outside.
function raster(image, width, height, sky, scale, zs, phis) {
  const colour = Uint32Array.from(sky.values, (value) => rgba(Math.round(255 * scale(value)) * 3));
  const unscanned = rgba(-1);
  const none = LEVELS.length;
  // Per slot, the first region it is in (0: 50 %, 1: 90 %, LEVELS.length: none).
  const region = Uint8Array.from(sky.values, (value) => {
    const at = LEVELS.findIndex((level) => value <= level.value);
    return at < 0 ? none : at;
  });
  const panel = new Int32Array(width * height);
  locate(sky, width, zs, phis, panel);
  const px = new Uint32Array(image.data.buffer); // a pixel at a time: one write, not four
  const inRegion = new Uint8Array(width * height).fill(none);
  let [first, last] = [-1, -1]; // the first and last pixels in a region
  for (let k = 0; k < panel.length; k++) {
    const slot = panel[k];
    if (slot >= 0) {
      px[k] = colour[slot];
      if (region[slot] === none) continue;
      inRegion[k] = region[slot];
      if (first < 0) first = k;
      last = k;
    } else if (slot === -1) {
      px[k] = unscanned;
    }
  }
  const [top, bottom] = first < 0 ? [0, -1] : [Math.floor(first / width), Math.floor(last / width)];
  const image8 = image.data;
  LEVELS.forEach((level, n) => { // a region's pixels with a neighbour outside it
    const [r, g, b] = level.colour;
    for (let j = top; j <= bottom; j++) {
      for (let i = 0, k = j * width; i < width; i++, k++) {
        if (inRegion[k] > n) continue;
        const edge = (i > 0 && inRegion[k - 1] > n) || (i < width - 1 && inRegion[k + 1] > n) ||
          (j > 0 && inRegion[k - width] > n) || (j < height - 1 && inRegion[k + width] > n);
        if (!edge) continue;
        const o = k * 4;
        image8[o] = r; image8[o + 1] = g; image8[o + 2] = b;
      }
    }
  });
}

function colourBar(ctx, x, y, w, ticks, scale, title) {
  const bar = ctx.createImageData(w, BAR.h);
  for (let i = 0; i < w; i++) {
    const c = Math.round((255 * i) / (w - 1)) * 3;
    for (let j = 0; j < BAR.h; j++) bar.data.set([LUT[c], LUT[c + 1], LUT[c + 2], 255], (j * w + i) * 4);
  }
  ctx.putImageData(bar, x, y);
  ctx.fillStyle = INK;
  ctx.strokeStyle = INK;
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const [value, label] of ticks) {
    const at = x + scale(value) * (w - 1);
    ctx.fillRect(at, y + BAR.h, 1, 4);
    ctx.fillText(label, at, y + BAR.h + 6);
  }
  ctx.fillText(title, x + w / 2, y + BAR.h + 22);
}

function marker(ctx, x, y) {
  ctx.lineWidth = 2;
  for (const [colour, width] of [["#000", 4], ["#fff", 2]]) {
    ctx.strokeStyle = colour;
    ctx.lineWidth = width;
    ctx.beginPath();
    ctx.arc(x, y, 7, 0, TWO_PI);
    ctx.moveTo(x - 12, y); ctx.lineTo(x - 4, y);
    ctx.moveTo(x + 4, y); ctx.lineTo(x + 12, y);
    ctx.moveTo(x, y - 12); ctx.lineTo(x, y - 4);
    ctx.moveTo(x, y + 4); ctx.lineTo(x, y + 12);
    ctx.stroke();
  }
}

function graticule(ctx, project) {
  ctx.strokeStyle = "rgba(110,110,110,0.55)";
  ctx.lineWidth = 1;
  const line = (points) => {
    ctx.beginPath();
    points.forEach(([x, y], n) => (n ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
    ctx.stroke();
  };
  const steps = [...Array(91).keys()].map((n) => n / 90);
  for (const dec of [-60, -30, 0, 30, 60]) {
    line(steps.map((f) => project(1e-6 + f * (TWO_PI - 2e-6), (dec * Math.PI) / 180)));
  }
  for (const ra of [0, 60, 120, 240, 300]) {
    line(steps.map((f) => project((ra * Math.PI) / 180 + 1e-6, (-90 + 180 * f) * (Math.PI / 180))));
  }
}

// The Mollweide panel's directions: per canvas pixel sin dec (NaN off the sky) and RA. A row has one
// z, its RA falling evenly from left to right.
function mollweideDirections() {
  const [rx, ry] = [MOLL.w / 2, MOLL.h / 2];
  const zs = new Float64Array(MOLL.w * MOLL.h).fill(NaN);
  const phis = new Float64Array(MOLL.w * MOLL.h);
  for (let j = 0; j < MOLL.h; j++) {
    const t = Math.asin((ry - j - 0.5) / ry);
    const z = (2 * t + Math.sin(2 * t)) / Math.PI;
    const across = rx * Math.cos(t);
    const step = -Math.PI / across;
    for (let i = 0; i < MOLL.w; i++) {
      const u = i + 0.5 - rx;
      if (Math.abs(u) > across) continue;
      zs[j * MOLL.w + i] = z;
      phis[j * MOLL.w + i] = Math.PI + u * step;
    }
  }
  return [zs, phis];
}

// The zoom's directions (gnomonic around ra0, dec0; `perPixel` of the tangent plane a canvas pixel,
// east to the left): the point x east, y north of the centre on the tangent plane, normalised.
function zoomDirections(ra0, dec0, perPixel) {
  const [sd, cd, sr, cr] = [Math.sin(dec0), Math.cos(dec0), Math.sin(ra0), Math.cos(ra0)];
  const [cx, cy, cz] = [cd * cr, cd * sr, sd];
  const [ex, ey] = [-sr, cr];
  const [nx, ny, nz] = [-sd * cr, -sd * sr, cd];
  const zs = new Float64Array(ZOOM.size * ZOOM.size);
  const phis = new Float64Array(ZOOM.size * ZOOM.size);
  for (let j = 0, k = 0; j < ZOOM.size; j++) {
    const y = (ZOOM.size / 2 - j - 0.5) * perPixel;
    for (let i = 0; i < ZOOM.size; i++, k++) {
      const x = -(i + 0.5 - ZOOM.size / 2) * perPixel;
      const vx = cx + x * ex + y * nx;
      const vy = cy + x * ey + y * ny;
      const vz = cz + y * nz;
      zs[k] = vz / Math.sqrt(vx * vx + vy * vy + vz * vz);
      phis[k] = Math.atan2(vy, vx);
    }
  }
  return [zs, phis];
}

// Draws `sky` (readResult's) on `canvas`; returns the best fit's canvas position in each panel.
export function draw(canvas, sky) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, W, H);
  ctx.font = "13px system-ui, sans-serif";
  const { best } = sky;
  const bra = (best.ra * Math.PI) / 180;
  const bdec = (best.dec * Math.PI) / 180;

  // Full sky: log-scaled colours, unit coordinates to canvas pixels and back.
  const top = Math.log10(1 + Math.max(sky.max, 1));
  const logScale = (v) => Math.min(1, Math.log10(1 + v) / top);
  const rx = MOLL.w / 2;
  const ry = MOLL.h / 2;
  const toCanvas = (ra, dec) => {
    const [x, y] = mollweide(ra, dec);
    return [MOLL.x + rx + (x / (2 * SQRT2)) * rx, MOLL.y + ry - (y / SQRT2) * ry];
  };
  const full = ctx.createImageData(MOLL.w, MOLL.h);
  const found = slots(sky.layers);
  const [zs, phis] = mollweideDirections();
  raster(full, MOLL.w, MOLL.h, found, logScale, zs, phis);
  ctx.putImageData(full, MOLL.x, MOLL.y);
  graticule(ctx, toCanvas);
  const fullAt = toCanvas(bra, bdec);
  marker(ctx, ...fullAt);

  // Zoom: gnomonic around the best fit, linear colours from 0 to ZOOM_TOP.
  const half = zoomHalfWidth(sky);
  const perPixel = (2 * Math.tan(half)) / ZOOM.size;
  const linear = (v) => Math.min(1, v / ZOOM_TOP);
  const [zoomZs, zoomPhis] = zoomDirections(bra, bdec, perPixel);
  const zoom = ctx.createImageData(ZOOM.size, ZOOM.size);
  raster(zoom, ZOOM.size, ZOOM.size, found, linear, zoomZs, zoomPhis);
  ctx.putImageData(zoom, ZOOM.x, ZOOM.y);
  const zoomAt = [ZOOM.x + ZOOM.size / 2, ZOOM.y + ZOOM.size / 2];
  marker(ctx, ...zoomAt);
  ctx.strokeStyle = INK;
  ctx.lineWidth = 1;
  ctx.strokeRect(ZOOM.x - 0.5, ZOOM.y - 0.5, ZOOM.size + 1, ZOOM.size + 1);
  const scaleBar = gnomonic(bra, bdec, bra, bdec + Math.PI / 180); // one degree north
  if (scaleBar && Math.abs(scaleBar[1]) / perPixel < ZOOM.size / 2 - 12) {
    const length = scaleBar[1] / perPixel;
    ctx.fillStyle = INK;
    ctx.fillRect(ZOOM.x + 10, ZOOM.y + ZOOM.size - 14, length, 3);
    ctx.textAlign = "left";
    ctx.textBaseline = "bottom";
    ctx.fillText("1°", ZOOM.x + 10, ZOOM.y + ZOOM.size - 17);
  }

  // Labels, colour bars and the legend.
  ctx.fillStyle = INK;
  ctx.textAlign = "left";
  ctx.textBaseline = "alphabetic";
  ctx.fillText("Full sky (Mollweide, equatorial; RA 180° at the centre, increasing to the left)", MOLL.x, 20);
  ctx.fillText(`Best fit ±${((half * 180) / Math.PI).toFixed(1)}° (gnomonic; north up, east left)`, ZOOM.x, 20);
  ctx.textAlign = "center";
  for (const ra of [0, 90, 180, 270]) {
    const [x, y] = toCanvas((ra * Math.PI) / 180 + 1e-6, 0);
    ctx.fillText(`${ra}°`, ra === 0 ? x - 14 : x, y - 4);
  }
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const dec of [-60, -30, 30, 60]) { // beside the left edge, where RA is 360°
    const [x, y] = toCanvas(TWO_PI - 1e-6, (dec * Math.PI) / 180);
    ctx.fillText(`${dec > 0 ? "+" : "−"}${Math.abs(dec)}°`, x - 3, y);
  }
  ctx.textBaseline = "alphabetic";
  const logTicks = [0, 1, 10, 100, 1000, 10000].filter((v) => v <= Math.max(sky.max, 1)).map((v) => [v, String(v)]);
  colourBar(ctx, MOLL.x + 60, BAR.y, MOLL.w - 120, logTicks, logScale, "−2 ΔlnL (log scale)");
  colourBar(ctx, ZOOM.x + 10, BAR.y, ZOOM.size - 30, [0, 5, 10, 15, 20].map((v) => [v, v === ZOOM_TOP ? `≥${v}` : String(v)]),
    linear, "−2 ΔlnL");
  ctx.textAlign = "left";
  ctx.textBaseline = "alphabetic";
  let x = MOLL.x;
  const legendY = H - 8;
  const text = `Best fit RA ${best.ra.toFixed(2)}°, Dec ${best.dec.toFixed(2)}°. Regions (Wilks):`;
  ctx.fillText(text, x, legendY);
  x += ctx.measureText(text).width + 10;
  for (const level of LEVELS) {
    ctx.fillStyle = `rgb(${level.colour.join(",")})`;
    ctx.fillRect(x, legendY - 10, 18, 10);
    ctx.strokeRect(x - 0.5, legendY - 10.5, 19, 11);
    ctx.fillStyle = INK;
    const label = `${level.name} (−2 ΔlnL ≤ ${level.value})`;
    ctx.fillText(label, x + 24, legendY);
    x += 24 + ctx.measureText(label).width + 14;
  }
  return { full: fullAt, zoom: zoomAt };
}

// ---------------------------------------------------------------- on the page

const FIGURES = new WeakMap(); // the page's result section -> its figure, kept across refreshes

function signature(stored) {
  const found = stored?.scan_result || {};
  const counts = Object.entries(found).map(([k, v]) => `${k}:${Array.isArray(v?.data) ? v.data.length : 0}`);
  return `${counts.join(",")}|${Boolean(stored?.is_final)}`;
}

// The result's table: nside, pixels, best llh.
export function resultTable(scanResult) {
  const rows = readResult(scanResult).layers.slice().reverse();
  if (!rows.length) return "";
  return el("table", { class: "nsides" },
    el("thead", {}, el("tr", {}, ["nside", "pixels", "best llh"].map((t) => el("th", { scope: "col", text: t })))),
    el("tbody", {}, rows.map((layer) => el("tr", {},
      el("td", { class: "number", text: layer.nside }),
      el("td", { class: "number", text: layer.values.size }),
      el("td", { class: "number", text: Number.isFinite(layer.best) ? layer.best.toFixed(3) : "—" }),
    ))));
}

// The skymap of `stored` (GET /scan/{id}'s `result`) as a figure kept for `holder` and redrawn only
// when the result has changed (its pixels per nside, is_final); "" while there are no pixels.
export function skymapFigure(holder, stored) {
  let figure = FIGURES.get(holder);
  const now = signature(stored);
  if (figure?.dataset.signature === now) return figure.dataset.empty === "yes" ? "" : figure;
  performance.mark("skyscan:skymap:start");
  const sky = readResult(stored?.scan_result); // never throws: what it cannot read, it leaves out
  if (!figure) {
    const canvas = el("canvas", { class: "skymap", width: W, height: H, role: "img" });
    canvas.style.maxWidth = "100%"; // CSSOM, not an inline style attribute: the CSP allows it
    canvas.style.height = "auto";
    figure = el("figure", { class: "skymap" }, canvas, el("figcaption", {}));
    FIGURES.set(holder, figure);
  }
  figure.dataset.signature = now;
  const [canvas, caption] = figure.children;
  if (!sky.best) {
    figure.dataset.empty = "yes";
    return "";
  }
  figure.dataset.empty = "no";
  let at;
  try {
    at = draw(canvas, sky);
  } catch (error) { // the page's other parts stay live; the next result tries again
    figure.dataset.signature = "";
    return el("p", { class: "skymap-failure", text: `The skymap cannot be drawn from this result (${error.message}).` });
  }
  const { best } = sky;
  const where = `RA ${best.ra.toFixed(2)}°, Dec ${best.dec.toFixed(2)}°`;
  const summary = `Skymap of ${sky.count} pixels (nsides ${sky.layers.map((l) => l.nside).reverse().join(", ")}); ` +
    `best fit ${where} (nside ${best.nside} pixel ${best.pixel}), llh ${best.llh.toFixed(3)}.`;
  canvas.setAttribute("aria-label", summary);
  caption.textContent = `${stored?.is_final ? "Final" : "Partial"} result. ${summary} Outlined: the 50 % and 90 % ` +
    "regions (−2 ΔlnL ≤ 1.39 and ≤ 4.61, Wilks, as skyreader draws them).";
  Object.assign(canvas.dataset, {
    bestRa: best.ra, bestDec: best.dec, bestNside: best.nside, bestPixel: best.pixel, bestLlh: best.llh,
    bestX: at.full[0], bestY: at.full[1], zoomX: at.zoom[0], zoomY: at.zoom[1], pixels: sky.count,
    final: Boolean(stored?.is_final),
  });
  performance.mark("skyscan:skymap:drawn");
  const took = performance.measure("skyscan:skymap:draw", "skyscan:skymap:start", "skyscan:skymap:drawn");
  canvas.dataset.drawMs = took.duration.toFixed(1);
  return figure;
}
