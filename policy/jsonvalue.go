package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// jsonValue converts a JSON document to the Rego value policies read, in one
// pass over the bytes: no intermediate map[string]any, which is where most of
// an admission's policy cost went (decoding the object twice over). Numbers
// keep their literal text (ast.Number), so integers stay exact. Malformed
// JSON is an error that says where.
func jsonValue(b []byte) (ast.Value, error) { return parseJSON(b, false, wholeValue) }

// apiObjectValue is jsonValue for an API object, without its
// metadata.managedFields: the server-side apply bookkeeping, which mirrors
// every field of the object (as large as the spec) and which no rule about a
// Deployment needs. The API server sets it before admission; leaving it out
// also makes the webhook's input the one `deployguard check` builds from a
// manifest.
func apiObjectValue(b []byte, reads *projection) (ast.Value, error) { return parseJSON(b, true, reads) }

// parseJSON converts b; of its members and elements, only what reads reads
// is built, the rest checked.
func parseJSON(b []byte, skipManagedFields bool, reads *projection) (ast.Value, error) {
	p := jsonParser{b: b, keys: make(map[string]*ast.Term, 64), skipManagedFields: skipManagedFields}
	p.space()
	v, err := p.value(0, "", reads)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.i != len(p.b) {
		return nil, p.errorf("trailing data after the document")
	}
	return v, nil
}

// maxDepth bounds nesting, so that hostile input cannot exhaust the stack; an
// API object is nowhere near it.
const maxDepth = 1000

type jsonParser struct {
	b []byte
	i int
	// items and terms are scratch stacks: each object or array appends its
	// members above where its parent's stop, and takes them off when built.
	items [][2]*ast.Term
	terms []*ast.Term
	// keys shares one term per member name: API objects repeat a few names
	// (name, value, image …) many times.
	keys map[string]*ast.Term
	// skipManagedFields leaves metadata.managedFields out (checked, not built).
	skipManagedFields bool
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *jsonParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value parses a value at depth; key is the member name it is the value of
// ("" for the document and array elements).
func (p *jsonParser) value(depth int, key string, reads *projection) (ast.Value, error) {
	if depth > maxDepth {
		return nil, p.errorf("nested deeper than %d", maxDepth)
	}
	if p.i >= len(p.b) {
		return nil, p.errorf("unexpected end")
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return p.object(depth, key, reads)
	case c == '[':
		return p.array(depth, reads)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		return ast.String(s), nil
	case c == 't':
		return p.literal("true", ast.Boolean(true))
	case c == 'f':
		return p.literal("false", ast.Boolean(false))
	case c == 'n':
		return p.literal("null", ast.Null{})
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		return nil, p.errorf("unexpected %q", c)
	}
}

func (p *jsonParser) literal(word string, v ast.Value) (ast.Value, error) {
	if len(p.b)-p.i < len(word) || string(p.b[p.i:p.i+len(word)]) != word {
		return nil, p.errorf("expected %s", word)
	}
	p.i += len(word)
	return v, nil
}

func (p *jsonParser) object(depth int, name string, reads *projection) (ast.Value, error) {
	if p.open('}') {
		return ast.NewObject(), nil
	}
	base := len(p.items)
	defer func() { p.items = p.items[:base] }()
	for {
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, p.errorf("expected a member name")
		}
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		k := string(key.Value.(ast.String))
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, p.errorf("expected ':'")
		}
		p.i++
		p.space()
		child := reads.child(k)
		if child == nil || p.skipManagedFields && depth == 1 && name == "metadata" && k == "managedFields" {
			if err := p.skip(depth + 1); err != nil {
				return nil, err
			}
		} else {
			v, err := p.value(depth+1, k, child)
			if err != nil {
				return nil, err
			}
			p.items = append(p.items, [2]*ast.Term{key, ast.NewTerm(v)})
		}
		if end, err := p.next('}', "an object"); err != nil {
			return nil, err
		} else if end {
			return newObject(p.items[base:]), nil
		}
	}
}

// newObject builds an object of items in one allocation. A repeated member
// keeps its last value, as encoding/json does; the API server never sends
// one, so that case takes the slow path.
func newObject(items [][2]*ast.Term) ast.Object {
	if !hasDuplicateKey(items) {
		return ast.NewObject(items...)
	}
	obj := ast.NewObjectWithCapacity(len(items))
	for _, kv := range items {
		obj.Insert(kv[0], kv[1])
	}
	return obj
}

func hasDuplicateKey(items [][2]*ast.Term) bool {
	if len(items) <= 16 {
		for i := range items {
			for j := range i {
				if items[i][0] == items[j][0] {
					return true
				}
			}
		}
		return false
	}
	seen := make(map[*ast.Term]struct{}, len(items))
	for _, kv := range items {
		if _, dup := seen[kv[0]]; dup {
			return true
		}
		seen[kv[0]] = struct{}{}
	}
	return false
}

func (p *jsonParser) array(depth int, reads *projection) (ast.Value, error) {
	if p.open(']') {
		return ast.NewArray(), nil
	}
	base := len(p.terms)
	defer func() { p.terms = p.terms[:base] }()
	for i := 0; ; i++ {
		p.space()
		// An element nothing reads keeps its place, as null.
		var v ast.Value = ast.Null{}
		if child := reads.element(i); child != nil {
			var err error
			if v, err = p.value(depth+1, "", child); err != nil {
				return nil, err
			}
		} else if err := p.skip(depth + 1); err != nil {
			return nil, err
		}
		p.terms = append(p.terms, ast.NewTerm(v))
		if end, err := p.next(']', "an array"); err != nil {
			return nil, err
		} else if end {
			// An array keeps its slice: give it one of its own.
			return ast.NewArray(slices.Clone(p.terms[base:])...), nil
		}
	}
}

// open moves past the opening byte of an object or an array; empty when
// closing follows it, moved past too.
func (p *jsonParser) open(closing byte) (empty bool) {
	p.i++
	p.space()
	if p.i < len(p.b) && p.b[p.i] == closing {
		p.i++
		return true
	}
	return false
}

// next moves past what follows a member of an object or an element of an
// array (what): a comma, before the next, or closing, the container's end
// (end true).
func (p *jsonParser) next(closing byte, what string) (end bool, err error) {
	p.space()
	if p.i >= len(p.b) {
		return false, p.errorf("unexpected end in %s", what)
	}
	switch p.b[p.i] {
	case ',':
		p.i++
		return false, nil
	case closing:
		p.i++
		return true, nil
	}
	return false, p.errorf("expected ',' or '%c'", closing)
}

// skip checks a value as value does, building nothing.
func (p *jsonParser) skip(depth int) error {
	if depth > maxDepth {
		return p.errorf("nested deeper than %d", maxDepth)
	}
	if p.i >= len(p.b) {
		return p.errorf("unexpected end")
	}
	open, end := byte(0), byte(0)
	switch c := p.b[p.i]; c {
	case '{':
		open, end = '{', '}'
	case '[':
		open, end = '[', ']'
	case '"':
		return p.skipString()
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return p.scanNumber()
	default:
		_, err := p.value(depth, "", wholeValue)
		return err
	}
	p.i++
	p.space()
	if p.i < len(p.b) && p.b[p.i] == end {
		p.i++
		return nil
	}
	for {
		p.space()
		if open == '{' {
			if p.i >= len(p.b) || p.b[p.i] != '"' {
				return p.errorf("expected a member name")
			}
			if err := p.skipString(); err != nil {
				return err
			}
			p.space()
			if p.i >= len(p.b) || p.b[p.i] != ':' {
				return p.errorf("expected ':'")
			}
			p.i++
			p.space()
		}
		if err := p.skip(depth + 1); err != nil {
			return err
		}
		p.space()
		if p.i >= len(p.b) {
			if open == '{' {
				return p.errorf("unexpected end in an object")
			}
			return p.errorf("unexpected end in an array")
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case end:
			p.i++
			return nil
		default:
			return p.errorf("expected ',' or %q", end)
		}
	}
}

// skipString checks a string, copying nothing. Its escapes are checked in
// place: managed fields, which every object from the API server carries and
// no policy reads, name list items by escaped JSON ("k:{\"name\":\"web\"}"),
// and unquoting each of them cost hundreds of allocations per request. Only
// a string that is invalid is unquoted as str does, so that the same input
// fails with the same error.
func (p *jsonParser) skipString() error {
	start := p.i
	_, ok, err := p.scanString()
	if err != nil || ok || validEscapes(p.b[start+1:p.i-1]) {
		return err
	}
	p.i = start
	_, err = p.str()
	return err
}

// validEscapes reports whether every escape in the content of a string is
// one encoding/json accepts: \", \\, \/, \b, \f, \n, \r, \t, or \u and four
// hex digits (an unpaired surrogate is replaced, not refused, and so is
// invalid UTF-8).
func validEscapes(content []byte) bool {
	for i := 0; i < len(content); i++ {
		if content[i] != '\\' {
			continue
		}
		if i+1 >= len(content) {
			return false
		}
		i++
		switch content[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			if i+4 >= len(content) {
				return false
			}
			for _, h := range content[i+1 : i+5] {
				if !isHex(h) {
					return false
				}
			}
			i += 4
		default:
			return false
		}
	}
	return true
}

// key reads a member name as its term, shared by every member of that name
// (p.keys). A name already seen costs no allocation.
func (p *jsonParser) key() (*ast.Term, error) {
	start := p.i
	plain, ok, err := p.scanString()
	if err != nil {
		return nil, err
	}
	if ok {
		if t, seen := p.keys[string(plain)]; seen {
			return t, nil
		}
	}
	p.i = start
	k, err := p.str()
	if err != nil {
		return nil, err
	}
	// An escaped name may be one seen unescaped ("\u0061" is "a"): the
	// same term, so that a repeated member is found (hasDuplicateKey).
	if t, seen := p.keys[k]; seen {
		return t, nil
	}
	t := ast.StringTerm(k)
	p.keys[k] = t
	return t, nil
}

// str reads a string. The common case, no escapes and valid UTF-8, is a
// copy of the input's bytes; anything else goes through encoding/json's own
// unquoting, so that escapes mean exactly what they mean to the API server.
func (p *jsonParser) str() (string, error) {
	start := p.i
	plain, ok, err := p.scanString()
	if err != nil {
		return "", err
	}
	if ok {
		return string(plain), nil
	}
	var s string
	if err := json.Unmarshal(p.b[start:p.i], &s); err != nil {
		p.i = start
		return "", p.errorf("bad string: %v", err)
	}
	return s, nil
}

// scanString moves past the string at p.i and returns its content when it
// means itself (no escapes, valid UTF-8), with ok set; otherwise ok is false
// and the caller unquotes p.b[start:p.i].
func (p *jsonParser) scanString() (plain []byte, ok bool, err error) {
	start := p.i
	p.i++ // "
	escaped, ascii := false, true
	for p.i < len(p.b) {
		// Most bytes of most strings need no decision: a table lookup,
		// not four comparisons.
		if plainByte[p.b[p.i]] {
			p.i++
			continue
		}
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			content := p.b[start+1 : p.i-1]
			if escaped || !ascii && !utf8.Valid(content) {
				return nil, false, nil
			}
			return content, true, nil
		case c == '\\':
			escaped = true
			p.i += 2
		case c < 0x20:
			return nil, false, p.errorf("control character in a string")
		case c >= 0x80:
			ascii = false
			p.i++
		default:
			p.i++
		}
	}
	return nil, false, p.errorf("unterminated string")
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// plainByte marks the bytes that mean themselves inside a string: ASCII,
// neither a control character, a quote nor a backslash.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func (p *jsonParser) number() (ast.Value, error) {
	start := p.i
	if err := p.scanNumber(); err != nil {
		return nil, err
	}
	lit := string(p.b[start:p.i])
	if _, err := strconv.ParseFloat(lit, 64); err != nil && !isRangeErr(err) {
		return nil, p.errorf("bad number %q", lit)
	}
	return ast.Number(lit), nil
}

// scanNumber moves past a number, checking its grammar (all that
// strconv.ParseFloat could refuse but for its range).
func (p *jsonParser) scanNumber() error {
	if p.b[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	intStart := p.i
	if digits() == 0 {
		return p.errorf("bad number")
	}
	if p.b[intStart] == '0' && p.i-intStart > 1 {
		return p.errorf("leading zero in a number")
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return p.errorf("bad fraction")
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return p.errorf("bad exponent")
		}
	}
	return nil
}

func isRangeErr(err error) bool {
	var ne *strconv.NumError
	return errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange)
}
