//! The surface syntax of `graph!`, parsed into syn's own AST so that every token keeps its
//! span:
//!
//! ```text
//! graph! {
//!     #[attrs] vis Name(group: [Actor], input: Type, ..) {
//!         let pattern = expr;   // pattern: `name` or `(a, b, ..)`
//!         expr;                 // a call kept for its effect
//!         output_expr           // a value or a tuple of values
//!     }
//! }
//! ```

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{braced, parenthesized, Attribute, Ident, Stmt, Token, Type, Visibility};

/// One or more graph definitions.
pub(crate) struct Graphs(pub(crate) Vec<GraphDef>);

pub(crate) struct GraphDef {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) name: Ident,
    pub(crate) params: Vec<ParamDef>,
    pub(crate) stmts: Vec<Stmt>,
}

pub(crate) struct ParamDef {
    pub(crate) name: Ident,
    pub(crate) ty: Type,
}

impl Parse for Graphs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut defs = Vec::new();
        while !input.is_empty() {
            defs.push(input.parse()?);
        }
        Ok(Graphs(defs))
    }
}

impl Parse for GraphDef {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let name = input.parse()?;
        let content;
        parenthesized!(content in input);
        let params = Punctuated::<ParamDef, Token![,]>::parse_terminated(&content)?
            .into_iter()
            .collect();
        let body;
        braced!(body in input);
        let stmts = body.call(syn::Block::parse_within)?;
        Ok(GraphDef {
            attrs,
            vis,
            name,
            params,
            stmts,
        })
    }
}

impl Parse for ParamDef {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name = input.parse()?;
        input.parse::<Token![:]>()?;
        let ty = input.parse()?;
        Ok(ParamDef { name, ty })
    }
}
