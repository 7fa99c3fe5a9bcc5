#include "common/jinja/parser.h"

#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/jinja/builtins.h"

namespace dflash::jinja {
namespace {

Node MakeNode(Node::Kind kind, size_t pos, std::string text = "") {
  Node n;
  n.kind = kind;
  n.pos = pos;
  n.text = std::move(text);
  return n;
}

std::shared_ptr<Expr> NewExpr(Expr::Kind kind, size_t pos) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

// Expressions inside one tag, by jinja2's precedence (lowest first): conditional, or, and, not,
// comparisons, + -, ~, * / // %, **, unary - +, then primaries with postfixes, filters and tests.
class ExprParser {
 public:
  ExprParser(absl::string_view name, absl::string_view src, const Segment& seg, size_t first)
      : name_(name), src_(src), toks_(seg.tokens), i_(first), end_pos_(seg.end_pos) {}

  size_t index() const { return i_; }
  bool AtEnd() const { return i_ >= toks_.size(); }
  const Token* Peek(size_t ahead = 0) const {
    return i_ + ahead < toks_.size() ? &toks_[i_ + ahead] : nullptr;
  }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    const Token* t = Peek(ahead);
    return t && t->kind == Token::Kind::kOp && t->text == op;
  }
  bool IsName(absl::string_view n, size_t ahead = 0) const {
    const Token* t = Peek(ahead);
    return t && t->kind == Token::Kind::kName && t->text == n;
  }
  size_t Pos() const { return AtEnd() ? end_pos_ : toks_[i_].pos; }

  absl::Status Error(size_t pos, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(name_, src_, pos), ": ", what));
  }
  absl::Status Expect(absl::string_view op) {
    if (!IsOp(op)) {
      return Error(Pos(), absl::StrCat("expected '", op, "'",
                                       AtEnd() ? " before the end of the tag"
                                               : absl::StrCat(", got '", Peek()->text, "'")));
    }
    ++i_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (AtEnd() || Peek()->kind != Token::Kind::kName) return Error(Pos(), "expected a name");
    return toks_[i_++].text;
  }
  absl::Status ExpectEnd() const {
    if (!AtEnd()) return Error(Pos(), absl::StrCat("unexpected '", Peek()->text, "'"));
    return absl::OkStatus();
  }

  // An expression, or a bare tuple "a, b" when `tuple` (as {{ }} and set allow).
  absl::StatusOr<ExprPtr> Parse(bool tuple = false, bool condexpr = true) {
    const size_t pos = Pos();
    ASSIGN_OR_RETURN(ExprPtr first, condexpr ? Condition() : Or());
    if (!tuple || !IsOp(",")) return first;
    auto t = NewExpr(Expr::Kind::kTuple, pos);
    t->args.push_back(first);
    while (IsOp(",")) {
      ++i_;
      if (AtEnd() || IsOp(")") || IsOp("]") || IsOp("}")) break;  // (a,)
      ASSIGN_OR_RETURN(ExprPtr e, condexpr ? Condition() : Or());
      t->args.push_back(e);
    }
    return ExprPtr(t);
  }

 private:
  absl::StatusOr<ExprPtr> Condition() {
    ASSIGN_OR_RETURN(ExprPtr then, Or());
    while (IsName("if")) {
      const size_t pos = Pos();
      ++i_;
      auto c = NewExpr(Expr::Kind::kCondition, pos);
      ASSIGN_OR_RETURN(ExprPtr cond, Or());
      ExprPtr otherwise;
      if (IsName("else")) {
        ++i_;
        ASSIGN_OR_RETURN(otherwise, Condition());
      }
      c->args = {cond, then, otherwise};
      then = c;
    }
    return then;
  }

  absl::StatusOr<ExprPtr> Binary(absl::StatusOr<ExprPtr> (ExprParser::*next)(),
                                 std::initializer_list<absl::string_view> ops, bool names) {
    ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (true) {
      const Token* t = Peek();
      if (t == nullptr || t->kind != (names ? Token::Kind::kName : Token::Kind::kOp)) break;
      bool match = false;
      for (absl::string_view op : ops) match |= t->text == op;
      if (!match) break;
      ++i_;
      auto b = NewExpr(Expr::Kind::kBinary, t->pos);
      b->name = t->text;
      ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
      b->args = {left, right};
      left = b;
    }
    return left;
  }
  absl::StatusOr<ExprPtr> Or() { return Binary(&ExprParser::And, {"or"}, true); }
  absl::StatusOr<ExprPtr> And() { return Binary(&ExprParser::Not, {"and"}, true); }
  absl::StatusOr<ExprPtr> Not() {
    if (!IsName("not")) return Compare();
    auto u = NewExpr(Expr::Kind::kUnary, Pos());
    ++i_;
    u->name = "not";
    ASSIGN_OR_RETURN(ExprPtr operand, Not());
    u->args = {operand};
    return ExprPtr(u);
  }
  absl::StatusOr<ExprPtr> Compare() {
    const size_t pos = Pos();
    ASSIGN_OR_RETURN(ExprPtr first, Math1());
    auto c = NewExpr(Expr::Kind::kCompare, pos);
    c->args.push_back(first);
    while (true) {
      const Token* t = Peek();
      if (t == nullptr) break;
      std::string op;
      if (t->kind == Token::Kind::kOp && (t->text == "==" || t->text == "!=" || t->text == "<" ||
                                          t->text == ">" || t->text == "<=" || t->text == ">=")) {
        op = t->text;
        ++i_;
      } else if (IsName("in")) {
        op = "in";
        ++i_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        i_ += 2;
      } else {
        break;
      }
      ASSIGN_OR_RETURN(ExprPtr operand, Math1());
      c->ops.push_back(op);
      c->args.push_back(operand);
    }
    if (c->ops.empty()) return first;
    return ExprPtr(c);
  }
  absl::StatusOr<ExprPtr> Math1() { return Binary(&ExprParser::Concat, {"+", "-"}, false); }
  absl::StatusOr<ExprPtr> Concat() { return Binary(&ExprParser::Math2, {"~"}, false); }
  absl::StatusOr<ExprPtr> Math2() { return Binary(&ExprParser::Pow, {"*", "/", "//", "%"}, false); }
  absl::StatusOr<ExprPtr> Pow() { return Binary(&ExprParser::UnaryWithFilters, {"**"}, false); }
  absl::StatusOr<ExprPtr> UnaryWithFilters() { return Unary(true); }

  absl::StatusOr<ExprPtr> Unary(bool with_filter) {
    if (IsOp("-") || IsOp("+")) {
      auto u = NewExpr(Expr::Kind::kUnary, Pos());
      u->name = Peek()->text;
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr operand, Unary(false));
      u->args = {operand};
      ExprPtr node = u;
      if (with_filter) return FilterExpr(node);
      return node;
    }
    ASSIGN_OR_RETURN(ExprPtr node, Primary());
    ASSIGN_OR_RETURN(node, Postfix(node));
    if (with_filter) return FilterExpr(node);
    return node;
  }

  absl::StatusOr<ExprPtr> Primary() {
    if (AtEnd()) return Error(Pos(), "expected an expression before the end of the tag");
    const Token& t = toks_[i_];
    auto lit = NewExpr(Expr::Kind::kLiteral, t.pos);
    switch (t.kind) {
      case Token::Kind::kName: {
        ++i_;
        if (t.text == "true" || t.text == "True") {
          lit->literal = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          lit->literal = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          lit->literal = Value::None();
        } else {
          auto n = NewExpr(Expr::Kind::kName, t.pos);
          n->name = t.text;
          return ExprPtr(n);
        }
        return ExprPtr(lit);
      }
      case Token::Kind::kString: {
        std::string s;
        while (!AtEnd() && Peek()->kind == Token::Kind::kString) s += toks_[i_++].text;
        lit->literal = Value(std::move(s));
        return ExprPtr(lit);
      }
      case Token::Kind::kInt:
        ++i_;
        lit->literal = Value(static_cast<int64_t>(std::strtoll(t.text.c_str(), nullptr, 10)));
        return ExprPtr(lit);
      case Token::Kind::kFloat:
        ++i_;
        lit->literal = Value(std::strtod(t.text.c_str(), nullptr));
        return ExprPtr(lit);
      case Token::Kind::kOp:
        break;
    }
    if (t.text == "(") {
      ++i_;
      if (IsOp(")")) {
        ++i_;
        return ExprPtr(NewExpr(Expr::Kind::kTuple, t.pos));
      }
      ASSIGN_OR_RETURN(ExprPtr e, Parse(/*tuple=*/true));
      RETURN_IF_ERROR(Expect(")"));
      return e;
    }
    if (t.text == "[") {
      ++i_;
      auto l = NewExpr(Expr::Kind::kList, t.pos);
      while (!IsOp("]")) {
        ASSIGN_OR_RETURN(ExprPtr e, Parse());
        l->args.push_back(e);
        if (!IsOp(",")) break;
        ++i_;
      }
      RETURN_IF_ERROR(Expect("]"));
      return ExprPtr(l);
    }
    if (t.text == "{") {
      ++i_;
      auto d = NewExpr(Expr::Kind::kDict, t.pos);
      while (!IsOp("}")) {
        ASSIGN_OR_RETURN(ExprPtr key, Parse());
        RETURN_IF_ERROR(Expect(":"));
        ASSIGN_OR_RETURN(ExprPtr value, Parse());
        d->args.push_back(key);
        d->kwargs.emplace_back("", value);
        if (!IsOp(",")) break;
        ++i_;
      }
      RETURN_IF_ERROR(Expect("}"));
      return ExprPtr(d);
    }
    return Error(t.pos, absl::StrCat("unexpected '", t.text, "'"));
  }

  absl::StatusOr<ExprPtr> Postfix(ExprPtr node) {
    while (true) {
      if (IsOp(".")) {
        const size_t pos = Pos();
        ++i_;
        const Token* t = Peek();
        if (t == nullptr || (t->kind != Token::Kind::kName && t->kind != Token::Kind::kInt)) {
          return Error(Pos(), "expected an attribute name after '.'");
        }
        ++i_;
        auto a = NewExpr(
            t->kind == Token::Kind::kName ? Expr::Kind::kGetAttr : Expr::Kind::kGetItem, pos);
        if (t->kind == Token::Kind::kName) {
          a->name = t->text;
          a->args = {node};
        } else {
          auto idx = NewExpr(Expr::Kind::kLiteral, t->pos);
          idx->literal = Value(static_cast<int64_t>(std::strtoll(t->text.c_str(), nullptr, 10)));
          a->args = {node, idx};
        }
        node = a;
      } else if (IsOp("[")) {
        ASSIGN_OR_RETURN(node, Subscript(node));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, Call(node));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> Subscript(ExprPtr node) {
    const size_t pos = Pos();
    ++i_;  // [
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!IsOp("]")) {
      if (IsOp(":")) {
        if (++part > 2) return Error(Pos(), "too many ':' in a slice");
        slice = true;
        ++i_;
        continue;
      }
      if (parts[part]) return Error(Pos(), "expected ']' or ':'");
      ASSIGN_OR_RETURN(parts[part], Parse());
    }
    RETURN_IF_ERROR(Expect("]"));
    if (!slice) {
      if (!parts[0]) return Error(pos, "empty subscript");
      auto g = NewExpr(Expr::Kind::kGetItem, pos);
      g->args = {node, parts[0]};
      return ExprPtr(g);
    }
    auto s = NewExpr(Expr::Kind::kSlice, pos);
    s->args = {node, parts[0], parts[1], parts[2]};
    return ExprPtr(s);
  }

  // Call arguments after '(' into e->args (after what is there) and e->kwargs.
  absl::Status Args(Expr* e) {
    RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) return Error(Pos(), "*args / **kwargs are not supported");
      if (!AtEnd() && Peek()->kind == Token::Kind::kName && IsOp("=", 1)) {
        std::string key = toks_[i_].text;
        i_ += 2;
        ASSIGN_OR_RETURN(ExprPtr v, Parse());
        e->kwargs.emplace_back(std::move(key), v);
      } else {
        if (!e->kwargs.empty()) return Error(Pos(), "positional argument after a keyword argument");
        ASSIGN_OR_RETURN(ExprPtr v, Parse());
        e->args.push_back(v);
      }
      if (!IsOp(",")) break;
      ++i_;
    }
    return Expect(")");
  }

  absl::StatusOr<ExprPtr> Call(ExprPtr callee) {
    auto c = NewExpr(Expr::Kind::kCall, Pos());
    c->args = {callee};
    RETURN_IF_ERROR(Args(c.get()));
    return ExprPtr(c);
  }

  absl::StatusOr<ExprPtr> FilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        ++i_;
        auto f = NewExpr(Expr::Kind::kFilter, Pos());
        ASSIGN_OR_RETURN(f->name, ExpectName());
        if (!IsFilter(f->name))
          return Error(f->pos, absl::StrCat("unknown filter '", f->name, "'"));
        f->args = {node};
        if (IsOp("(")) RETURN_IF_ERROR(Args(f.get()));
        node = f;
      } else if (IsName("is")) {
        ++i_;
        auto t = NewExpr(Expr::Kind::kTest, Pos());
        if (IsName("not")) {
          t->negated = true;
          ++i_;
        }
        const size_t name_pos = Pos();
        ASSIGN_OR_RETURN(t->name, ExpectName());
        if (!IsTest(t->name)) return Error(name_pos, absl::StrCat("unknown test '", t->name, "'"));
        t->args = {node};
        if (IsOp("(")) {
          RETURN_IF_ERROR(Args(t.get()));
        } else if (const Token* a = Peek();
                   a && (a->kind != Token::Kind::kOp || a->text == "[" || a->text == "{") &&
                   !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if")) {
          ASSIGN_OR_RETURN(ExprPtr arg, Primary());
          ASSIGN_OR_RETURN(arg, Postfix(arg));
          t->args.push_back(arg);
        }
        node = t;
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, Call(node));
      } else {
        return node;
      }
    }
  }

  absl::string_view name_, src_;
  const std::vector<Token>& toks_;
  size_t i_;
  size_t end_pos_;
};

// Statements over the segment list.
class StmtParser {
 public:
  StmtParser(absl::string_view name, absl::string_view src, const std::vector<Segment>& segs)
      : name_(name), src_(src), segs_(segs) {}

  absl::StatusOr<Body> Run() {
    std::string end;
    ASSIGN_OR_RETURN(Body body, ParseBody({}, &end));
    return body;
  }

 private:
  absl::Status Error(size_t pos, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(name_, src_, pos), ": ", what));
  }
  static std::string Keyword(const Segment& s) {
    return s.tokens.empty() || s.tokens[0].kind != Token::Kind::kName ? "" : s.tokens[0].text;
  }

  // Parses nodes until a statement whose keyword is in `ends` (returned in *end; the segment
  // index stays on it) or the end of input (only when `ends` is empty).
  absl::StatusOr<Body> ParseBody(const std::set<std::string>& ends, std::string* end) {
    Body body;
    while (i_ < segs_.size()) {
      const Segment& s = segs_[i_];
      if (s.kind == Segment::Kind::kText) {
        body.push_back(MakeNode(Node::Kind::kText, s.pos, s.text));
        ++i_;
        continue;
      }
      if (s.kind == Segment::Kind::kExpr) {
        ExprParser p(name_, src_, s, 0);
        Node n = MakeNode(Node::Kind::kOutput, s.pos);
        ASSIGN_OR_RETURN(n.expr, p.Parse(/*tuple=*/true));
        RETURN_IF_ERROR(p.ExpectEnd());
        body.push_back(std::move(n));
        ++i_;
        continue;
      }
      const std::string kw = Keyword(s);
      if (ends.count(kw)) {
        *end = kw;
        return body;
      }
      ASSIGN_OR_RETURN(Node n, Statement(s, kw));
      body.push_back(std::move(n));
    }
    if (!ends.empty()) {
      return Error(src_.size(),
                   absl::StrCat("unexpected end of template, expected '", *ends.begin(), "'"));
    }
    return body;
  }

  absl::StatusOr<Node> Statement(const Segment& s, const std::string& kw) {
    if (kw == "if") return If(s);
    if (kw == "for") return For(s);
    if (kw == "set") return Set(s);
    if (kw == "macro") return Macro(s);
    if (kw == "generation") return Generation(s);
    if (kw == "break" || kw == "continue") {
      ExprParser p(name_, src_, s, 1);
      RETURN_IF_ERROR(p.ExpectEnd());
      ++i_;
      return MakeNode(kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, s.pos);
    }
    if (kw.empty()) return Error(s.pos, "a statement tag must start with a keyword");
    return Error(s.pos, absl::StrCat("unsupported statement '", kw, "'"));
  }

  // Consumes the closing statement (no arguments) at the current segment.
  absl::Status Close(const std::string& /*kw*/) {
    ExprParser p(name_, src_, segs_[i_], 1);
    RETURN_IF_ERROR(p.ExpectEnd());
    ++i_;
    return absl::OkStatus();
  }

  absl::StatusOr<Node> If(const Segment& s) {
    Node n = MakeNode(Node::Kind::kIf, s.pos);
    const Segment* cur = &s;
    while (true) {
      ExprParser p(name_, src_, *cur, 1);
      ASSIGN_OR_RETURN(ExprPtr cond, p.Parse());
      RETURN_IF_ERROR(p.ExpectEnd());
      ++i_;
      std::string end;
      ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &end));
      n.branches.emplace_back(cond, std::move(body));
      if (end == "elif") {
        cur = &segs_[i_];
        continue;
      }
      if (end == "else") {
        RETURN_IF_ERROR(Close(end));
        ASSIGN_OR_RETURN(n.else_body, ParseBody({"endif"}, &end));
      }
      RETURN_IF_ERROR(Close("endif"));
      return n;
    }
  }

  absl::StatusOr<Node> For(const Segment& s) {
    Node n = MakeNode(Node::Kind::kFor, s.pos);
    ExprParser p(name_, src_, s, 1);
    ASSIGN_OR_RETURN(std::string first, p.ExpectName());
    n.targets.push_back(first);
    while (p.IsOp(",")) {
      RETURN_IF_ERROR(p.Expect(","));
      ASSIGN_OR_RETURN(std::string target, p.ExpectName());
      n.targets.push_back(target);
    }
    if (!p.IsName("in")) return p.Error(p.Pos(), "expected 'in' in a for loop");
    RETURN_IF_ERROR(SkipName(&p));
    ASSIGN_OR_RETURN(n.expr, p.Parse(/*tuple=*/true, /*condexpr=*/false));
    if (p.IsName("if")) {
      RETURN_IF_ERROR(SkipName(&p));
      ASSIGN_OR_RETURN(n.cond, p.Parse());
    }
    if (p.IsName("recursive")) return p.Error(p.Pos(), "recursive loops are not supported");
    RETURN_IF_ERROR(p.ExpectEnd());
    ++i_;
    std::string end;
    ASSIGN_OR_RETURN(n.body, ParseBody({"else", "endfor"}, &end));
    if (end == "else") {
      RETURN_IF_ERROR(Close(end));
      ASSIGN_OR_RETURN(n.else_body, ParseBody({"endfor"}, &end));
    }
    RETURN_IF_ERROR(Close("endfor"));
    return n;
  }

  static absl::Status SkipName(ExprParser* p) { return p->ExpectName().status(); }

  absl::StatusOr<Node> Set(const Segment& s) {
    ExprParser p(name_, src_, s, 1);
    ASSIGN_OR_RETURN(std::string first, p.ExpectName());
    Node n = MakeNode(Node::Kind::kSet, s.pos);
    if (p.IsOp(".")) {
      RETURN_IF_ERROR(p.Expect("."));
      n.attr_of = first;
      ASSIGN_OR_RETURN(n.name, p.ExpectName());
    } else {
      n.targets.push_back(first);
      while (p.IsOp(",")) {
        RETURN_IF_ERROR(p.Expect(","));
        ASSIGN_OR_RETURN(std::string t, p.ExpectName());
        n.targets.push_back(t);
      }
    }
    if (p.AtEnd() && n.attr_of.empty() && n.targets.size() == 1) {  // {% set x %}...{% endset %}
      ++i_;
      n.kind = Node::Kind::kSetBlock;
      std::string end;
      ASSIGN_OR_RETURN(n.body, ParseBody({"endset"}, &end));
      RETURN_IF_ERROR(Close("endset"));
      return n;
    }
    if (p.IsOp("|")) return p.Error(p.Pos(), "filtered set blocks are not supported");
    RETURN_IF_ERROR(p.Expect("="));
    ASSIGN_OR_RETURN(n.expr, p.Parse(/*tuple=*/true));
    RETURN_IF_ERROR(p.ExpectEnd());
    ++i_;
    return n;
  }

  absl::StatusOr<Node> Macro(const Segment& s) {
    ExprParser p(name_, src_, s, 1);
    Node n = MakeNode(Node::Kind::kMacro, s.pos);
    ASSIGN_OR_RETURN(n.name, p.ExpectName());
    RETURN_IF_ERROR(p.Expect("("));
    while (!p.IsOp(")")) {
      ASSIGN_OR_RETURN(std::string param, p.ExpectName());
      ExprPtr dflt;
      if (p.IsOp("=")) {
        RETURN_IF_ERROR(p.Expect("="));
        ASSIGN_OR_RETURN(dflt, p.Parse());
      }
      n.params.emplace_back(param, dflt);
      if (!p.IsOp(",")) break;
      RETURN_IF_ERROR(p.Expect(","));
    }
    RETURN_IF_ERROR(p.Expect(")"));
    RETURN_IF_ERROR(p.ExpectEnd());
    ++i_;
    std::string end;
    ASSIGN_OR_RETURN(n.body, ParseBody({"endmacro"}, &end));
    RETURN_IF_ERROR(Close("endmacro"));
    return n;
  }

  absl::StatusOr<Node> Generation(const Segment& s) {
    ExprParser p(name_, src_, s, 1);
    RETURN_IF_ERROR(p.ExpectEnd());
    ++i_;
    Node n = MakeNode(Node::Kind::kGeneration, s.pos);
    std::string end;
    ASSIGN_OR_RETURN(n.body, ParseBody({"endgeneration"}, &end));
    RETURN_IF_ERROR(Close("endgeneration"));
    return n;
  }

  absl::string_view name_, src_;
  const std::vector<Segment>& segs_;
  size_t i_ = 0;
};

}  // namespace

absl::StatusOr<Body> Parse(absl::string_view name, absl::string_view source,
                           const std::vector<Segment>& segments) {
  return StmtParser(name, source, segments).Run();
}

}  // namespace dflash::jinja
