"""A small shop on SQLite: catalogue, carts and orders, a realistic request mix for latency measurements.

    GET  /api/products                 catalogue
    GET  /api/products/<id>
    POST /api/carts                    -> {"cart_id"}
    POST /api/carts/<id>/items         {"product_id", "quantity"}
    GET  /api/carts/<id>
    POST /api/orders                   {"cart_id"} -> order, stock decremented (409 when short)
    GET  /api/orders/<id>
    GET  /healthz

The three parts are separate blueprints over one database; they run in one process to stay light.
A connection per request, because sqlite3 connections do not cross threads.
"""

from __future__ import annotations

import sqlite3
import tempfile
import uuid
from pathlib import Path

from flask import Blueprint, Flask, g, jsonify, request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA = """
CREATE TABLE IF NOT EXISTS products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL, stock INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS carts (id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS cart_items (cart_id TEXT NOT NULL REFERENCES carts(id), product_id INTEGER NOT NULL REFERENCES products(id),
    quantity INTEGER NOT NULL, PRIMARY KEY (cart_id, product_id));
CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY AUTOINCREMENT, cart_id TEXT NOT NULL, total_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS order_lines (order_id INTEGER NOT NULL REFERENCES orders(id), product_id INTEGER NOT NULL,
    quantity INTEGER NOT NULL, price_cents INTEGER NOT NULL);
"""
CATALOGUE = [(f"Item {i:02d}", 199 + 150 * i, 1000) for i in range(1, 21)]
MAX_QUANTITY = 100


class AddItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    product_id: int = Field(ge=1)
    quantity: int = Field(ge=1, le=MAX_QUANTITY)


class PlaceOrder(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    cart_id: str = Field(min_length=1, max_length=64)


class ShopError(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _db() -> sqlite3.Connection:
    if "db" not in g:
        g.db = sqlite3.connect(g.db_path, timeout=10)
        g.db.row_factory = sqlite3.Row
    return g.db


def _body(model: type[BaseModel]) -> BaseModel:
    data = request.get_json(silent=True)
    if not isinstance(data, dict):
        raise ShopError("body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ShopError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None


catalogue = Blueprint("catalogue", __name__)
cart = Blueprint("cart", __name__)
orders = Blueprint("orders", __name__)


@catalogue.get("/api/products")
def list_products():
    rows = _db().execute("SELECT id, name, price_cents, stock FROM products ORDER BY id").fetchall()
    return jsonify([dict(r) for r in rows])


@catalogue.get("/api/products/<int:pid>")
def get_product(pid: int):
    row = _db().execute("SELECT id, name, price_cents, stock FROM products WHERE id = ?", (pid,)).fetchone()
    if row is None:
        raise ShopError(f"no product {pid}", 404)
    return jsonify(dict(row))


def _cart(cid: str) -> dict:
    db = _db()
    if db.execute("SELECT 1 FROM carts WHERE id = ?", (cid,)).fetchone() is None:
        raise ShopError(f"no cart {cid}", 404)
    items = db.execute(
        "SELECT p.id AS product_id, p.name, ci.quantity, p.price_cents FROM cart_items ci "
        "JOIN products p ON p.id = ci.product_id WHERE ci.cart_id = ? ORDER BY p.id", (cid,)).fetchall()
    lines = [dict(r) for r in items]
    return {"cart_id": cid, "items": lines, "total_cents": sum(x["quantity"] * x["price_cents"] for x in lines)}


@cart.post("/api/carts")
def new_cart():
    cid = uuid.uuid4().hex
    with _db() as db:
        db.execute("INSERT INTO carts (id) VALUES (?)", (cid,))
    return jsonify(cart_id=cid), 201


@cart.post("/api/carts/<cid>/items")
def add_item(cid: str):
    item = _body(AddItem)
    with _db() as db:
        if db.execute("SELECT 1 FROM carts WHERE id = ?", (cid,)).fetchone() is None:
            raise ShopError(f"no cart {cid}", 404)
        if db.execute("SELECT 1 FROM products WHERE id = ?", (item.product_id,)).fetchone() is None:
            raise ShopError(f"no product {item.product_id}", 404)
        db.execute(
            "INSERT INTO cart_items (cart_id, product_id, quantity) VALUES (?, ?, ?) "
            "ON CONFLICT (cart_id, product_id) DO UPDATE SET quantity = MIN(quantity + excluded.quantity, ?)",
            (cid, item.product_id, item.quantity, MAX_QUANTITY))
    return jsonify(_cart(cid))


@cart.get("/api/carts/<cid>")
def get_cart(cid: str):
    return jsonify(_cart(cid))


@orders.post("/api/orders")
def place_order():
    req = _body(PlaceOrder)
    content = _cart(req.cart_id)
    if not content["items"]:
        raise ShopError("cart is empty")
    db = _db()
    # BEGIN IMMEDIATE: take the write lock before checking stock, so two orders cannot both take the last item.
    db.execute("BEGIN IMMEDIATE")
    try:
        for line in content["items"]:
            cur = db.execute("UPDATE products SET stock = stock - ? WHERE id = ? AND stock >= ?",
                             (line["quantity"], line["product_id"], line["quantity"]))
            if cur.rowcount != 1:
                raise ShopError(f"not enough stock of product {line['product_id']}", 409)
        oid = db.execute("INSERT INTO orders (cart_id, total_cents) VALUES (?, ?)",
                         (req.cart_id, content["total_cents"])).lastrowid
        db.executemany("INSERT INTO order_lines VALUES (?, ?, ?, ?)",
                       [(oid, x["product_id"], x["quantity"], x["price_cents"]) for x in content["items"]])
        db.execute("DELETE FROM cart_items WHERE cart_id = ?", (req.cart_id,))
        db.commit()
    except BaseException:
        db.rollback()
        raise
    return jsonify(order_id=oid, total_cents=content["total_cents"]), 201


@orders.get("/api/orders/<int:oid>")
def get_order(oid: int):
    db = _db()
    row = db.execute("SELECT id, cart_id, total_cents FROM orders WHERE id = ?", (oid,)).fetchone()
    if row is None:
        raise ShopError(f"no order {oid}", 404)
    lines = db.execute("SELECT product_id, quantity, price_cents FROM order_lines WHERE order_id = ?", (oid,)).fetchall()
    return jsonify(dict(row) | {"lines": [dict(r) for r in lines]})


def init_db(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")  # readers do not wait for the writer
        db.executescript(SCHEMA)
        if db.execute("SELECT COUNT(*) FROM products").fetchone()[0] == 0:
            db.executemany("INSERT INTO products (name, price_cents, stock) VALUES (?, ?, ?)", CATALOGUE)


def create_app(db_path: Path | None = None) -> Flask:
    path = Path(db_path) if db_path else Path(tempfile.mkdtemp(prefix="joulesched-shop-")) / "shop.db"
    init_db(path)
    app = Flask("joulesched-shop")

    @app.before_request
    def _bind_db():
        g.db_path = path

    @app.teardown_appcontext
    def _close_db(exc):
        db = g.pop("db", None)
        if db is not None:
            db.close()

    @app.errorhandler(ShopError)
    def _err(exc: ShopError):
        return jsonify(error=str(exc)), exc.status

    @app.get("/healthz")
    def healthz():
        _db().execute("SELECT 1")
        return jsonify(status="ok", kind="shop")

    for bp in (catalogue, cart, orders):
        app.register_blueprint(bp)
    return app
