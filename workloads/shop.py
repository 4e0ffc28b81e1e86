"""A small multi-service shop: catalogue, cart and orders, each its own service with its own SQLite tables.

    catalogue   GET  /api/products                  the catalogue
                GET  /api/products/<id>
                POST /api/products/reserve          {"lines": [{"product_id", "quantity"}], "reservation_id"?}
                                                    -> prices; 409 when short (the same id again: the same answer)
                DELETE /api/products/reservations/<id>   give a reservation's stock back (orders does, when the
                                                    reserve's answer was lost or the order could not be recorded)
    cart        POST /api/carts                     -> {"cart_id"}
                POST /api/carts/<id>/items          {"product_id", "quantity"}   (checks the product with catalogue)
                GET  /api/carts/<id>                items priced by catalogue
                DELETE /api/carts/<id>/items        empty it (orders does, after an order)
    orders      POST /api/orders                    {"cart_id"}: reads the cart, reserves stock, records the order
                GET  /api/orders/<id>
    every part  GET  /healthz

Split, the services call each other over HTTP (``--catalogue-url``, ``--cart-url``), which is what makes the
load realistic: one user request fans out into several. ``--part all`` serves the three in one process with
in-process calls, for a light single-port setup. Each call opens its own SQLite connection, since sqlite3
connections do not cross threads.

Ids are SQLite integers (at most 2**63 - 1; a bigger one is no product or order, 404/400) and cart ids are what
``POST /api/carts`` hands out (32 hex digits; anything else is no cart, 404, and never reaches a neighbour).
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import tempfile
import threading
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import requests
from flask import Blueprint, Flask, jsonify, request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from werkzeug.exceptions import RequestEntityTooLarge

from joulesched.core.errors import JouleschedError, UsageError, validation_summary
from joulesched.workloads.server import request_body

log = logging.getLogger("joulesched.shop")

PARTS = ("all", "catalogue", "cart", "orders")
CATALOGUE = [(f"Item {i:02d}", 199 + 150 * i, 1000) for i in range(1, 21)]
MAX_QUANTITY = 100
UPSTREAM_TIMEOUT_S = 5.0
#: Request bodies are a cart line or an order: small JSON.
MAX_CONTENT_LENGTH = 64 << 10
#: The largest id SQLite stores (a signed 64-bit INTEGER); a bigger one would be an OverflowError, not a 404.
MAX_ID = 2**63 - 1
#: A cart id as Carts.create makes it (uuid4().hex); a reservation id is one too.
CART_ID = re.compile(r"[0-9a-f]{32}")

SCHEMAS = {
    "catalogue": "CREATE TABLE IF NOT EXISTS products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                 "price_cents INTEGER NOT NULL, stock INTEGER NOT NULL);"
                 # what each reservation took (its answer, for a retry), and whether it was given back
                 "CREATE TABLE IF NOT EXISTS reservations (id TEXT PRIMARY KEY, lines TEXT NOT NULL, "
                 "released INTEGER NOT NULL DEFAULT 0);",
    "cart": "CREATE TABLE IF NOT EXISTS carts (id TEXT PRIMARY KEY);"
            "CREATE TABLE IF NOT EXISTS cart_items (cart_id TEXT NOT NULL REFERENCES carts(id), "
            "product_id INTEGER NOT NULL, quantity INTEGER NOT NULL, PRIMARY KEY (cart_id, product_id));",
    "orders": "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY AUTOINCREMENT, cart_id TEXT NOT NULL, "
              "total_cents INTEGER NOT NULL);"
              "CREATE TABLE IF NOT EXISTS order_lines (order_id INTEGER NOT NULL REFERENCES orders(id), "
              "product_id INTEGER NOT NULL, quantity INTEGER NOT NULL, price_cents INTEGER NOT NULL);",
}


class ShopError(JouleschedError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Line(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    product_id: int = Field(ge=1, le=MAX_ID)
    quantity: int = Field(ge=1, le=MAX_QUANTITY)


class Reserve(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    lines: list[Line] = Field(min_length=1, max_length=100)
    reservation_id: str | None = Field(default=None, pattern=f"^{CART_ID.pattern}$")  # (unanchored: a search)


class PlaceOrder(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    cart_id: str = Field(min_length=1, max_length=64)


def check_cart_id(cid: str) -> str:
    """``cid`` if it has the form of the ids this shop makes, else ShopError 404: no such cart can exist."""
    if CART_ID.fullmatch(cid) is None:
        raise ShopError(f"no cart {cid!r} (cart ids are 32 hex digits, as POST /api/carts gives them)", 404)
    return cid


def check_reservation_id(rid: str) -> str:
    if CART_ID.fullmatch(rid) is None:
        raise ShopError(f"no reservation {rid!r} (reservation ids are 32 hex digits)", 404)
    return rid


#: How long a write waits for SQLite's lock: less than a neighbour's upstream timeout, so a service gives up on
#: the lock before its caller gives up on it (a review: a reservation committed 7 s in, after the orders
#: service had answered 502, took stock no order records, and the retry took it again).
DB_BUSY_TIMEOUT_S = UPSTREAM_TIMEOUT_S - 1.0


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=DB_BUSY_TIMEOUT_S)
    db.row_factory = sqlite3.Row
    return db


def init_db(path: Path, part: str) -> None:
    """Create ``part``'s tables (all three for ``all``) and seed the catalogue."""
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("PRAGMA journal_mode=WAL")  # readers do not wait for the writer
        for name in (("catalogue", "cart", "orders") if part == "all" else (part,)):
            db.executescript(SCHEMAS[name])
        if part in ("all", "catalogue") and db.execute("SELECT COUNT(*) FROM products").fetchone()[0] == 0:
            db.executemany("INSERT INTO products (name, price_cents, stock) VALUES (?, ?, ?)", CATALOGUE)


# ---- the services' logic, behind small interfaces so a neighbour can be in-process or over HTTP ----------
class CatalogueAPI(Protocol):
    def products(self) -> list[dict]: ...
    def product(self, pid: int) -> dict: ...
    def reserve(self, lines: list[dict], reservation_id: str | None = None) -> list[dict]: ...
    def release(self, reservation_id: str) -> bool: ...


class CartAPI(Protocol):
    def get(self, cid: str) -> dict: ...
    def clear(self, cid: str) -> None: ...


class Catalogue:
    def __init__(self, path: Path):
        self.path = path

    def products(self) -> list[dict]:
        with closing(_connect(self.path)) as db:
            return [dict(r) for r in db.execute("SELECT id, name, price_cents, stock FROM products ORDER BY id")]

    def product(self, pid: int) -> dict:
        with closing(_connect(self.path)) as db:
            row = db.execute("SELECT id, name, price_cents, stock FROM products WHERE id = ?", (pid,)).fetchone()
        if row is None:
            raise ShopError(f"no product {pid}", 404)
        return dict(row)

    def reserve(self, lines: list[dict], reservation_id: str | None = None) -> list[dict]:
        """Take stock for every line or for none (409); returns the lines with their prices. Under a
        ``reservation_id`` the reservation is recorded: the same id again answers as the first time and takes
        nothing more (a retry whose first answer was lost), and an id already released is a 409."""
        with closing(_connect(self.path)) as db:
            # BEGIN IMMEDIATE takes the write lock before checking stock: two orders cannot both take the last item.
            db.execute("BEGIN IMMEDIATE")
            try:
                if reservation_id is not None and (row := db.execute(
                        "SELECT lines, released FROM reservations WHERE id = ?", (reservation_id,)).fetchone()):
                    if row["released"]:
                        raise ShopError(f"reservation {reservation_id} was released", 409)
                    db.rollback()
                    return json.loads(row["lines"])
                out = []
                for ln in lines:
                    cur = db.execute("UPDATE products SET stock = stock - ? WHERE id = ? AND stock >= ?",
                                     (ln["quantity"], ln["product_id"], ln["quantity"]))
                    if cur.rowcount != 1:
                        raise ShopError(f"not enough stock of product {ln['product_id']}", 409)
                    price = db.execute("SELECT price_cents FROM products WHERE id = ?",
                                       (ln["product_id"],)).fetchone()[0]
                    out.append({**ln, "price_cents": price})
                if reservation_id is not None:
                    db.execute("INSERT INTO reservations (id, lines) VALUES (?, ?)", (reservation_id, json.dumps(out)))
                db.commit()
            except BaseException:
                db.rollback()
                raise
        return out

    def release(self, reservation_id: str) -> bool:
        """Give a reservation's stock back, once; True if this call gave it back. An id not reserved yet is
        recorded as released, so a reserve still on its way (held up on the lock or the network) takes nothing."""
        with closing(_connect(self.path)) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT lines, released FROM reservations WHERE id = ?", (reservation_id,)).fetchone()
                if row is None:
                    db.execute("INSERT INTO reservations (id, lines, released) VALUES (?, '[]', 1)", (reservation_id,))
                elif not row["released"]:
                    db.executemany("UPDATE products SET stock = stock + ? WHERE id = ?",
                                   [(ln["quantity"], ln["product_id"]) for ln in json.loads(row["lines"])])
                    db.execute("UPDATE reservations SET released = 1 WHERE id = ?", (reservation_id,))
                db.commit()
            except BaseException:
                db.rollback()
                raise
        return row is not None and not row["released"]


class Carts:
    def __init__(self, path: Path, catalogue: CatalogueAPI):
        self.path = path
        self.catalogue = catalogue

    def create(self) -> str:
        cid = uuid.uuid4().hex
        with closing(_connect(self.path)) as db, db:
            db.execute("INSERT INTO carts (id) VALUES (?)", (cid,))
        return cid

    def _exists(self, db: sqlite3.Connection, cid: str) -> None:
        check_cart_id(cid)
        if db.execute("SELECT 1 FROM carts WHERE id = ?", (cid,)).fetchone() is None:
            raise ShopError(f"no cart {cid}", 404)

    def add(self, cid: str, line: Line) -> dict:
        with closing(_connect(self.path)) as db:
            self._exists(db, cid)
        self.catalogue.product(line.product_id)  # 404 from the catalogue for an unknown product
        with closing(_connect(self.path)) as db, db:
            db.execute("INSERT INTO cart_items (cart_id, product_id, quantity) VALUES (?, ?, ?) "
                       "ON CONFLICT (cart_id, product_id) DO UPDATE SET quantity = MIN(quantity + excluded.quantity, ?)",
                       (cid, line.product_id, line.quantity, MAX_QUANTITY))
        return self.get(cid)

    def get(self, cid: str) -> dict:
        with closing(_connect(self.path)) as db:
            self._exists(db, cid)
            items = [dict(r) for r in db.execute(
                "SELECT product_id, quantity FROM cart_items WHERE cart_id = ? ORDER BY product_id", (cid,))]
        if items:
            info = {p["id"]: p for p in self.catalogue.products()}
            for it in items:
                p = info.get(it["product_id"], {})
                it.update(name=p.get("name"), price_cents=p.get("price_cents", 0))
        return {"cart_id": cid, "items": items, "total_cents": sum(x["quantity"] * x["price_cents"] for x in items)}

    def clear(self, cid: str) -> None:
        with closing(_connect(self.path)) as db, db:
            self._exists(db, cid)
            db.execute("DELETE FROM cart_items WHERE cart_id = ?", (cid,))


class Orders:
    def __init__(self, path: Path, carts: CartAPI, catalogue: CatalogueAPI):
        self.path = path
        self.carts = carts
        self.catalogue = catalogue
        self._lock = threading.Lock()
        self._placing: set[str] = set()

    def place(self, cid: str) -> dict:
        """Order what cart ``cid`` holds and empty it. One order per cart at a time, the others 409: reading the
        cart, reserving stock and emptying the cart span services and cannot be one transaction, so two orders at
        once would both read the cart and both take its stock. The claim is this process's (one orders service)."""
        check_cart_id(cid)  # before it goes into a neighbour's URL
        with self._lock:
            if cid in self._placing:
                raise ShopError(f"an order for cart {cid} is already being placed", 409)
            self._placing.add(cid)
        try:
            return self._place(cid)
        finally:
            with self._lock:
                self._placing.discard(cid)

    def _place(self, cid: str) -> dict:
        content = self.carts.get(cid)
        if not content["items"]:
            raise ShopError("cart is empty")
        rid = uuid.uuid4().hex
        try:
            lines = self.catalogue.reserve([{"product_id": x["product_id"], "quantity": x["quantity"]}
                                            for x in content["items"]], rid)
        except ShopError as e:
            if e.status == 502:  # no answer: the stock may have been taken all the same
                self._release(rid)
            raise
        total = sum(x["quantity"] * x["price_cents"] for x in lines)
        try:
            with closing(_connect(self.path)) as db, db:
                oid = db.execute("INSERT INTO orders (cart_id, total_cents) VALUES (?, ?)", (cid, total)).lastrowid
                db.executemany("INSERT INTO order_lines VALUES (?, ?, ?, ?)",
                               [(oid, x["product_id"], x["quantity"], x["price_cents"]) for x in lines])
        except sqlite3.Error:  # no order holds that stock: give it back
            self._release(rid)
            raise
        try:
            self.carts.clear(cid)
        except ShopError as e:  # the order stands: a 502 now would make the client order it again
            log.warning("order %s placed, but cart %s could not be emptied: %s", oid, cid, e)
        return {"order_id": oid, "total_cents": total}

    def _release(self, rid: str) -> None:
        """Compensate a reservation no order records (a saga's undo); the catalogue's id makes it safe to send
        whether or not the reservation was made, and a reserve that arrives after it takes nothing."""
        try:
            if self.catalogue.release(rid):
                log.info("reservation %s given back: no order records it", rid)
        except ShopError as e:  # logged with its id, for the operator to release by hand
            log.error("reservation %s may still hold stock (DELETE /api/products/reservations/%s): %s", rid, rid, e)

    def get(self, oid: int) -> dict:
        with closing(_connect(self.path)) as db:
            row = db.execute("SELECT id, cart_id, total_cents FROM orders WHERE id = ?", (oid,)).fetchone()
            if row is None:
                raise ShopError(f"no order {oid}", 404)
            lines = db.execute("SELECT product_id, quantity, price_cents FROM order_lines WHERE order_id = ?",
                               (oid,)).fetchall()
        return dict(row) | {"lines": [dict(r) for r in lines]}


class _HTTP:
    """A neighbour service over HTTP; its 4xx come back as the same ShopError, anything else (another status, a
    reply that is not the shop's JSON, such as a proxy's or a wrong URL's HTML page) as 502."""

    def __init__(self, base_url: str):
        self.base = base_url.rstrip("/")
        self.session = requests.Session()

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.session.request(method, self.base + path, timeout=UPSTREAM_TIMEOUT_S, **kw)
        except requests.RequestException as e:
            raise ShopError(f"upstream {self.base} unreachable: {e.__class__.__name__}", 502) from None
        client_error = 400 <= r.status_code < 500
        if r.status_code >= 300 and not client_error:
            raise ShopError(f"upstream {self.base}{path} answered {r.status_code}", 502)
        try:
            body = r.json() if r.content else None
        except ValueError:
            raise ShopError(f"upstream {self.base}{path} answered {r.status_code} with a body that is not JSON",
                            502) from None
        if not client_error:
            return body
        if body is None:
            raise ShopError(r.reason, r.status_code)
        if not isinstance(body, dict) or not isinstance(body.get("error"), str):
            raise ShopError(f"upstream {self.base}{path} answered {r.status_code} without the shop's error", 502)
        raise ShopError(body["error"], r.status_code)


class CatalogueHTTP(_HTTP):
    def products(self) -> list[dict]:
        return self.call("GET", "/api/products")

    def product(self, pid: int) -> dict:
        return self.call("GET", f"/api/products/{int(pid)}")

    def reserve(self, lines: list[dict], reservation_id: str | None = None) -> list[dict]:
        body = {"lines": lines} | ({"reservation_id": reservation_id} if reservation_id else {})
        return self.call("POST", "/api/products/reserve", json=body)["lines"]

    def release(self, reservation_id: str) -> bool:
        return self.call("DELETE", f"/api/products/reservations/{check_reservation_id(reservation_id)}")["released"]


class CartHTTP(_HTTP):
    # A cart id comes from a client: quoted whole, so "../x", "a?b" or "a/b" stay one path segment upstream.
    def get(self, cid: str) -> dict:
        return self.call("GET", f"/api/carts/{quote(cid, safe='')}")

    def clear(self, cid: str) -> None:
        self.call("DELETE", f"/api/carts/{quote(cid, safe='')}/items")


# ---- HTTP front ----------------------------------------------------------------------------------------------
def _body(model: type[BaseModel]) -> Any:
    try:
        data = json.loads(request_body()) if request.is_json else None
    except (ValueError, RecursionError):  # '[' * 60000 fits in the body cap
        data = None
    if not isinstance(data, dict):
        raise ShopError("body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ShopError(validation_summary(exc)) from None


def catalogue_routes(cat: Catalogue) -> Blueprint:
    bp = Blueprint("catalogue", __name__)
    bp.add_url_rule("/api/products", "list", lambda: jsonify(cat.products()))
    bp.add_url_rule(f"/api/products/<int(max={MAX_ID}):pid>", "get", lambda pid: jsonify(cat.product(pid)))

    @bp.post("/api/products/reserve")
    def reserve():
        req = _body(Reserve)
        return jsonify(lines=cat.reserve([ln.model_dump() for ln in req.lines], req.reservation_id))

    @bp.delete("/api/products/reservations/<rid>")
    def release(rid: str):
        return jsonify(released=cat.release(check_reservation_id(rid)))

    return bp


def cart_routes(carts: Carts) -> Blueprint:
    bp = Blueprint("cart", __name__)
    bp.add_url_rule("/api/carts", "create", lambda: (jsonify(cart_id=carts.create()), 201), methods=["POST"])
    bp.add_url_rule("/api/carts/<cid>", "get", lambda cid: jsonify(carts.get(cid)))

    @bp.post("/api/carts/<cid>/items")
    def add_item(cid: str):
        return jsonify(carts.add(cid, _body(Line)))

    @bp.delete("/api/carts/<cid>/items")
    def clear(cid: str):
        carts.clear(cid)
        return "", 204

    return bp


def orders_routes(orders: Orders) -> Blueprint:
    bp = Blueprint("orders", __name__)
    bp.add_url_rule("/api/orders", "place", lambda: (jsonify(orders.place(_body(PlaceOrder).cart_id)), 201),
                    methods=["POST"])
    bp.add_url_rule(f"/api/orders/<int(max={MAX_ID}):oid>", "get", lambda oid: jsonify(orders.get(oid)))
    return bp


def create_app(db_path: Path | None = None, part: str = "all", catalogue_url: str | None = None,
               cart_url: str | None = None) -> Flask:
    """The Flask app of one shop service (or all three). Raises ValueError (a :class:`UsageError` for the
    database) for an unknown part, a missing neighbour URL or a database file that cannot be opened."""
    if part not in PARTS:
        raise ValueError(f"unknown shop part {part!r}; expected one of {', '.join(PARTS)}")
    if part in ("cart", "orders") and not catalogue_url:
        raise ValueError(f"the {part} service needs --catalogue-url")
    if part == "orders" and not cart_url:
        raise ValueError("the orders service needs --cart-url")
    # Without --db the database lives in a folder of its own that goes with the app, at the latest when the process
    # exits (SIGTERM too: workloads/server.py turns it into SystemExit, so the exit handlers run).
    tmp = None if db_path else tempfile.TemporaryDirectory(prefix="joulesched-shop-")
    path = Path(db_path) if db_path else Path(tmp.name) / "shop.db"
    try:
        init_db(path, part)
    except sqlite3.Error as exc:  # a missing folder, a directory, a file that is not SQLite, a read-only one
        if not path.parent.is_dir():
            raise UsageError(f"--db {path}: its folder {path.parent} does not exist") from None
        raise UsageError(f"--db {path}: cannot use it as the shop's SQLite database: {exc}") from None
    app = Flask(f"joulesched-shop-{part}")
    app.config["MAX_CONTENT_LENGTH"] = MAX_CONTENT_LENGTH
    if tmp is not None:
        app.extensions["joulesched-shop-db-folder"] = tmp
    if part == "all":
        cat = Catalogue(path)
        carts = Carts(path, cat)
        blueprints = [catalogue_routes(cat), cart_routes(carts), orders_routes(Orders(path, carts, cat))]
    elif part == "catalogue":
        blueprints = [catalogue_routes(Catalogue(path))]
    elif part == "cart":
        blueprints = [cart_routes(Carts(path, CatalogueHTTP(catalogue_url)))]
    else:
        blueprints = [orders_routes(Orders(path, CartHTTP(cart_url), CatalogueHTTP(catalogue_url)))]

    @app.errorhandler(ShopError)
    def _err(exc: ShopError):
        return jsonify(error=str(exc)), exc.status

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(exc: RequestEntityTooLarge):
        return jsonify(error=f"body is over the {request.max_content_length}-byte limit"), 413

    @app.get("/healthz")
    def healthz():
        with closing(_connect(path)) as db:
            db.execute("SELECT 1")
        return jsonify(status="ok", kind="shop", part=part)

    for bp in blueprints:
        app.register_blueprint(bp)
    return app
