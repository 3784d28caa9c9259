//! Error collection: a macro reports every error it finds in one pass, each at the user's
//! tokens, instead of stopping at the first; and `tidy`, how those messages show the
//! user's tokens.

use proc_macro2::{Delimiter, Spacing, Span, TokenStream, TokenTree};
use quote::ToTokens;

#[derive(Default)]
pub(crate) struct Diag {
    errors: Vec<syn::Error>,
}

impl Diag {
    pub(crate) fn error(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.errors.push(syn::Error::new(span, msg));
    }

    /// An error spanning all of `tokens`.
    pub(crate) fn error_at(&mut self, tokens: impl ToTokens, msg: impl std::fmt::Display) {
        self.errors.push(syn::Error::new_spanned(tokens, msg));
    }

    pub(crate) fn push(&mut self, e: syn::Error) {
        self.errors.push(e);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// Every message, in the order reported (a combined error's parts one by one).
    #[cfg(test)]
    pub(crate) fn messages(&self) -> Vec<String> {
        self.errors
            .iter()
            .flat_map(|e| e.clone().into_iter().map(|e| e.to_string()))
            .collect()
    }

    /// One `compile_error!` per error.
    pub(crate) fn to_tokens(&self) -> TokenStream {
        self.errors
            .iter()
            .map(syn::Error::to_compile_error)
            .collect()
    }
}

/// Tokens as a person writes them (`Vec<[f32; 4]>`, `workers[0]`, `ReduceOp::Avg`), for
/// messages, labels and the picture: the one way the macros turn user tokens into text.
/// A space goes between two tokens unless Rust style has none there.
pub(crate) fn tidy(tokens: impl ToTokens) -> String {
    let mut out = String::new();
    write_tidy(&mut out, tokens.into_token_stream());
    out
}

/// What came before a token, as far as the space before it depends on it.
#[derive(Clone, Copy)]
enum Prev {
    Start,
    /// An identifier: a keyword or lifetime (`mut [T]`, `'a [T]`) keeps a space before a
    /// bracket, a name (`f(x)`, `xs[0]`) does not.
    Ident {
        name_like: bool,
    },
    Group,
    Punct {
        ch: char,
        joint: bool,
        path_sep: bool,
    },
}

fn write_tidy(out: &mut String, tokens: TokenStream) {
    let mut prev = Prev::Start;
    for tt in tokens {
        if space_between(prev, &tt) {
            out.push(' ');
        }
        prev = match &tt {
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                write_tidy(out, g.stream());
                out.push_str(close);
                Prev::Group
            }
            TokenTree::Ident(i) => {
                let name = i.to_string();
                let lifetime = matches!(
                    prev,
                    Prev::Punct {
                        ch: '\'',
                        joint: true,
                        ..
                    }
                );
                out.push_str(&name);
                Prev::Ident {
                    name_like: !lifetime && !KEYWORDS.contains(&name.as_str()),
                }
            }
            TokenTree::Punct(p) => {
                out.push(p.as_char());
                Prev::Punct {
                    ch: p.as_char(),
                    joint: p.spacing() == Spacing::Joint,
                    path_sep: p.as_char() == ':'
                        && matches!(
                            prev,
                            Prev::Punct {
                                ch: ':',
                                joint: true,
                                ..
                            }
                        ),
                }
            }
            TokenTree::Literal(l) => {
                out.push_str(&l.to_string());
                Prev::Ident { name_like: false }
            }
        };
    }
}

/// Keywords after which a bracket or parenthesis keeps its space (`&mut [f32]`).
const KEYWORDS: &[&str] = &["mut", "dyn", "impl", "as", "in", "const", "where", "for"];

fn space_between(prev: Prev, next: &TokenTree) -> bool {
    match prev {
        Prev::Start => return false,
        // `::`, `->`, `'a`, `..`: one token of several characters.
        Prev::Punct { joint: true, .. } => return false,
        // `a::b`, `&x`, `a.b`, `Vec<T`, `-1`.
        Prev::Punct { path_sep: true, .. } => return false,
        Prev::Punct {
            ch: '&' | '.' | '<' | '-',
            ..
        } => return false,
        _ => {}
    }
    match next {
        TokenTree::Punct(p) => !matches!(p.as_char(), ',' | ';' | '.' | ':' | '<' | '>' | '?'),
        // A call or an index: `f(x)`, `xs[0]`, `f(x)(y)`.
        TokenTree::Group(g) if g.delimiter() != Delimiter::Brace => {
            !matches!(prev, Prev::Ident { name_like: true } | Prev::Group)
        }
        _ => true,
    }
}

/// Names as code, for messages: "`a`, `b`, `c`".
pub(crate) fn code_list(names: impl IntoIterator<Item = impl std::fmt::Display>) -> String {
    names
        .into_iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::{code_list, tidy};

    #[test]
    fn tidy_writes_types_as_rust_style_does() {
        for (tokens, text) in [
            (quote!(Vec<[f32; 4]>), "Vec<[f32; 4]>"),
            (quote!(model::Worker<f32>), "model::Worker<f32>"),
            (quote!(Option<Vec<f32>>), "Option<Vec<f32>>"),
            (quote!((f32, [u8; 2])), "(f32, [u8; 2])"),
            (quote!(&'a [u8]), "&'a [u8]"),
            (quote!(&mut [f32]), "&mut [f32]"),
            (quote!(x: &Tensor<f32>), "x: &Tensor<f32>"),
            (quote!(fn(f32) -> f32), "fn(f32) -> f32"),
            (quote!(Box<dyn Fn(u8) + Send>), "Box<dyn Fn(u8) + Send>"),
            (quote!(<T as Trait>::Out), "<T as Trait>::Out"),
            (quote!(HashMap<K, V>), "HashMap<K, V>"),
        ] {
            assert_eq!(tidy(tokens), text);
        }
    }

    #[test]
    fn tidy_writes_expressions_as_rust_style_does() {
        for (tokens, text) in [
            (quote!(workers[0]), "workers[0]"),
            (quote!(workers[0].step(x, y)), "workers[0].step(x, y)"),
            (quote!(ReduceOp::Avg), "ReduceOp::Avg"),
            (quote!(-1), "-1"),
            (quote!((a, b)), "(a, b)"),
            (quote!(allreduce([a, b], Avg)), "allreduce([a, b], Avg)"),
        ] {
            assert_eq!(tidy(tokens), text);
        }
    }

    #[test]
    fn code_list_quotes_each_name() {
        assert_eq!(code_list(["Sum", "Avg"]), "`Sum`, `Avg`");
        assert_eq!(code_list(Vec::<&str>::new()), "");
    }
}
