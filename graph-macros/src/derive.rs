//! `#[derive(Bucketable)]`, `#[derive(Gather)]` and `#[derive(Scatter)]` for a struct:
//! each field is a part of the value (see the runtime's `bucket::parts`), so a struct of
//! tensors and scalars travels as one value, its fields read in place and its result's
//! fields views of the stage's buffer.
//!
//! The derive knows no types: each field's type gets a bound spanned at the field, so a
//! field that cannot go through a collective is reported there.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{parse_quote, Data, DeriveInput, Fields, Member, Type, WhereClause};

use crate::respan::respan;
use crate::rt;

/// What the three derives share: the struct's name, generics and fields.
struct Item {
    input: DeriveInput,
    fields: Vec<(Member, Type)>,
}

impl Item {
    /// The struct, or an error at the item for an enum or a union.
    fn parse(input: TokenStream, derive: &str) -> syn::Result<Self> {
        let input: DeriveInput = syn::parse2(input)?;
        let fields = match &input.data {
            Data::Struct(s) => match &s.fields {
                Fields::Named(f) => f
                    .named
                    .iter()
                    .filter_map(|f| Some((Member::Named(f.ident.clone()?), f.ty.clone())))
                    .collect(),
                Fields::Unnamed(f) => f
                    .unnamed
                    .iter()
                    .enumerate()
                    .map(|(i, f)| (Member::Unnamed(syn::Index::from(i)), f.ty.clone()))
                    .collect(),
                Fields::Unit => Vec::new(),
            },
            Data::Enum(e) => return Err(not_a_struct(e.enum_token.span, derive)),
            Data::Union(u) => return Err(not_a_struct(u.union_token.span, derive)),
        };
        Ok(Self { input, fields })
    }

    /// `impl<..> #trait_ for Name<..> where <the struct's bounds>, <field: bound>.. { #body }`
    fn impl_block(
        &self,
        trait_: TokenStream,
        bound: impl Fn(&Type) -> TokenStream,
        body: TokenStream,
    ) -> TokenStream {
        let name = &self.input.ident;
        let (impl_g, ty_g, where_c) = self.input.generics.split_for_impl();
        let mut where_c: WhereClause = where_c.cloned().unwrap_or_else(|| parse_quote!(where));
        for (_, ty) in &self.fields {
            // The whole predicate at the field: rustc reports an unmet bound at the bound's
            // tokens, which would otherwise point at the derive.
            let b = respan(bound(ty), ty.span());
            where_c
                .predicates
                .push(syn::parse_quote_spanned!(ty.span()=> #ty: #b));
        }
        quote! {
            #[automatically_derived]
            impl #impl_g #trait_ for #name #ty_g #where_c {
                #body
            }
        }
    }

    /// `f(member, span)` per field; `f` spans its tokens at the field's type, where a
    /// failed bound is then reported.
    fn each(&self, f: impl Fn(&Member, Span) -> TokenStream) -> Vec<TokenStream> {
        self.fields.iter().map(|(m, ty)| f(m, ty.span())).collect()
    }
}

fn not_a_struct(span: Span, derive: &str) -> syn::Error {
    syn::Error::new(
        span,
        format!(
            "`#[derive({derive})]` takes a struct, whose fields are the parts of the value; \
             implement `actorgraph::{derive}` by hand for an enum or a union"
        ),
    )
}

/// `#[derive(Bucketable)]`.
pub(crate) fn bucketable(input: TokenStream) -> TokenStream {
    let item = match Item::parse(input, "Bucketable") {
        Ok(item) => item,
        Err(e) => return e.to_compile_error(),
    };
    let rt = rt::path();
    let (u8_, usize_) = (
        quote!(::core::primitive::u8),
        quote!(::core::primitive::usize),
    );
    let adds = item.each(|m, s| quote_spanned!(s=> layout.add(&self.#m);));
    let hands = item.each(|m, s| quote_spanned!(s=> hand.add(&self.#m);));
    let unpacks = item.each(|m, s| quote_spanned!(s=> #m: parts.unpack(&self.#m),));
    let body = quote! {
        // A value made of parts has no elements of its own: the stage walks its parts.
        type Elem = #u8_;
        fn bucket_len(&self) -> #usize_ {
            0
        }
        fn pack(&self, _: &mut [#u8_]) {}
        fn unpack(&self, _: #rt::Reduced<'_, #u8_>) -> Self {
            #rt::Bucketable::unpack_parts(self, &mut #rt::Parts::detached())
        }
        fn add_parts(&self, layout: &mut #rt::Layout<'_>) {
            #(#adds)*
        }
        fn hand_parts<'__v>(&'__v self, hand: &mut #rt::Hand<'_, '__v>) {
            #(#hands)*
        }
        fn unpack_parts(&self, parts: &mut #rt::Parts<'_>) -> Self {
            Self { #(#unpacks)* }
        }
    };
    item.impl_block(
        quote!(#rt::Bucketable),
        |ty| quote_spanned!(ty.span()=> #rt::Bucketable),
        body,
    )
}

/// `#[derive(Gather)]`: the struct gathers into itself, each field gathered on its own, so
/// every field must gather into its own type (a tensor does; a scalar, which gathers into
/// a `Vec`, does not).
pub(crate) fn gather(input: TokenStream) -> TokenStream {
    let item = match Item::parse(input, "Gather") {
        Ok(item) => item,
        Err(e) => return e.to_compile_error(),
    };
    let rt = rt::path();
    let gathers = item.each(|m, s| quote_spanned!(s=> #m: parts.gather(&self.#m),));
    let gather = item.impl_block(
        quote!(#rt::Gather),
        |ty| quote_spanned!(ty.span()=> #rt::Gather<Gathered = #ty>),
        quote! {
            type Gathered = Self;
            fn gathered(
                &self,
                _: #rt::Reduced<'_, ::core::primitive::u8>,
                _: ::core::primitive::usize,
            ) -> Self {
                #rt::Gather::gather_parts(self, &mut #rt::Parts::detached())
            }
            fn gather_parts(&self, parts: &mut #rt::Parts<'_>) -> Self {
                Self { #(#gathers)* }
            }
        },
    );
    let list = item.impl_block(
        quote!(#rt::GatherList),
        |ty| quote_spanned!(ty.span()=> #rt::Gather<Gathered = #ty>),
        quote! {
            type List = #rt::Vec<Self>;
            fn gather_list(list: &[Self], parts: &mut #rt::Parts<'_>) -> #rt::Vec<Self> {
                ::core::iter::Iterator::collect(::core::iter::Iterator::map(
                    <[Self]>::iter(list),
                    |item| parts.gather(item),
                ))
            }
        },
    );
    quote!(#gather #list)
}

/// `#[derive(Scatter)]`: each field scattered on its own along its rows.
pub(crate) fn scatter(input: TokenStream) -> TokenStream {
    let item = match Item::parse(input, "Scatter") {
        Ok(item) => item,
        Err(e) => return e.to_compile_error(),
    };
    let rt = rt::path();
    let adds = item.each(|m, s| quote_spanned!(s=> layout.add_scatter(&self.#m);));
    let scatters = item.each(|m, s| quote_spanned!(s=> #m: parts.scatter(&self.#m),));
    item.impl_block(
        quote!(#rt::Scatter),
        |ty| quote_spanned!(ty.span()=> #rt::Scatter),
        quote! {
            fn scattered(
                &self,
                _: #rt::Reduced<'_, ::core::primitive::u8>,
                _: ::core::primitive::usize,
            ) -> Self {
                #rt::Scatter::scatter_parts(self, &mut #rt::Parts::detached())
            }
            fn add_scatter_parts(&self, layout: &mut #rt::Layout<'_>) {
                #(#adds)*
            }
            fn scatter_parts(&self, parts: &mut #rt::Parts<'_>) -> Self {
                Self { #(#scatters)* }
            }
        },
    )
}
