"""Twenty varied response models for structured-output tests (issue 21): nested objects, arrays, enums,
numbers with bounds, optional fields, literals, unions, dates, recursion. Strings are bounded where a base
model could otherwise write one forever (the bound is part of the schema the client sends)."""

from __future__ import annotations

from datetime import date
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field

Short = Field(max_length=24)
Word = Annotated[str, Field(max_length=24)]


class City(BaseModel):
    name: str = Short
    country: str = Short


class Person(BaseModel):
    name: str = Short
    age: int = Field(ge=0, le=120)


class Color(StrEnum):
    red = "red"
    green = "green"
    blue = "blue"


class Paint(BaseModel):
    color: Color
    litres: float = Field(gt=0, le=20)


class Address(BaseModel):
    street: str = Short
    city: City


class Customer(BaseModel):
    person: Person
    address: Address


class Basket(BaseModel):
    items: list[Word] = Field(min_length=1, max_length=4)


class Scores(BaseModel):
    values: list[int] = Field(min_length=2, max_length=5)


class Sentiment(BaseModel):
    label: Literal["positive", "neutral", "negative"]
    confidence: float = Field(ge=0, le=1)


class Review(BaseModel):
    stars: int = Field(ge=1, le=5)
    title: str = Short
    recommend: bool


class Event(BaseModel):
    title: str = Short
    day: date


class Contact(BaseModel):
    name: str = Short
    phone: str | None = Field(default=None, max_length=16)
    email: str | None = Field(default=None, max_length=32)


class Line(BaseModel):
    sku: str = Field(max_length=12)
    qty: int = Field(ge=1, le=99)


class Order(BaseModel):
    id: str = Field(max_length=12)
    lines: list[Line] = Field(min_length=1, max_length=3)
    paid: bool


class Point(BaseModel):
    x: float
    y: float


class Route(BaseModel):
    start: Point
    end: Point
    mode: Literal["walk", "bus", "car"]


class Flags(BaseModel):
    urgent: bool
    internal: bool
    archived: bool


class Measurement(BaseModel):
    value: float = Field(ge=-50, le=60)
    unit: Literal["C", "F"]


class Tagged(BaseModel):
    name: str = Short
    tags: list[Literal["food", "travel", "work", "family"]] = Field(max_length=3)


class Either(BaseModel):
    answer: int | bool


class Node(BaseModel):
    name: str = Field(max_length=12)
    children: list[Node] = Field(max_length=2)


class Weather(BaseModel):
    city: City
    today: Measurement
    rain: bool


class Survey(BaseModel):
    respondent: Person
    ratings: list[int] = Field(min_length=1, max_length=3)
    comment: str | None = Field(default=None, max_length=24)


# (model, what to ask for)
MODELS: list[tuple[type[BaseModel], str]] = [
    (City, "A city in Nigeria."),
    (Person, "A person who lives in Lagos."),
    (Paint, "Paint for a door."),
    (Customer, "A customer of a shop in Accra."),
    (Basket, "What to buy at the market."),
    (Scores, "Scores of three football matches."),
    (Sentiment, "The sentiment of: I love this phone."),
    (Review, "A review of a restaurant."),
    (Event, "A holiday in 2024."),
    (Contact, "A contact in my phone."),
    (Order, "An order of rice and beans."),
    (Route, "A trip across Lagos."),
    (Flags, "Flags of an email."),
    (Measurement, "The temperature in Dakar."),
    (Tagged, "A note about lunch."),
    (Either, "Is Abuja the capital of Nigeria?"),
    (Node, "A small family tree."),
    (Weather, "The weather in Kano."),
    (Survey, "A survey answer."),
    (Review, "A review of a hotel in Abuja."),
]
